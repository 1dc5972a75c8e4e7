#!/usr/bin/env python3
"""Start-up with a cold and a warm cache, side by side: ``split --list`` and a stage worker's start,
fresh, forked from the sweep's zygote (``controller.zygote``, torch already imported), and as a
remote host starts it over SSH: ``python -m paretopipe.controller.zygote_daemon`` forking it from
the host's daemon (``controller.zygote_daemon``), which a first start has left running.

Cold: an empty PARETOPIPE_CACHE_DIR, so the worker calibrates its weights and ``--list`` traces the
model. Warm: the same folder after the first run. Rounds alternate cold and warm so the machine's
drift hits both; the medians, the ratios, and how much of a warm start is importing torch and
torchvision (the floor no cache can remove) are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "mobilenetv2"
ROUNDS = 3


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PARETOPIPE_CACHE_DIR": str(cache)}


def split_list(cache: Path) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "paretopipe.split", "--model", MODEL, "--list"], env=_env(cache),
                   check=True, capture_output=True)
    return time.monotonic() - t0


WORKER_ARGS = ["--role", "stage1", "--model", MODEL, "--threads", "1"]


def _until_ready(proc, t0: float) -> float:
    """Seconds from ``t0`` to the worker's ``ready`` line; then the worker is told to quit."""
    ready = json.loads(proc.stdout.readline())
    elapsed = time.monotonic() - t0
    assert ready["event"] == "ready", ready
    proc.stdin.write('{"cmd": "quit"}\n')
    proc.stdin.close()
    proc.wait(30)
    return elapsed


def worker_start(cache: Path) -> float:
    """From spawning a stage worker to its ``ready`` line (model built, traced, fingerprinted)."""
    t0 = time.monotonic()
    return _until_ready(subprocess.Popen([sys.executable, "-m", "paretopipe.controller.worker", *WORKER_ARGS],
                                         env=_env(cache), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True), t0)


def worker_forked(zygote, cache: Path) -> float:
    """The same start, forked from a zygote that has already imported the stage code."""
    t0 = time.monotonic()
    return _until_ready(zygote.spawn("paretopipe.controller.worker", WORKER_ARGS, _env(cache)), t0)


def worker_from_daemon(cache: Path) -> float:
    """The command line a remote host runs, with the host's daemon already running."""
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "paretopipe.controller.zygote_daemon", "paretopipe.controller.worker", *WORKER_ARGS]
    return _until_ready(subprocess.Popen(argv, env=_env(cache), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True), t0)


def _stop_daemons() -> None:
    from paretopipe.controller.zygote_daemon import daemon_name

    subprocess.run(["pkill", "-f", f"zygote_server --listen {daemon_name()}"], check=False)


def import_floor() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, torchvision"], check=True)
    return time.monotonic() - t0


def main() -> int:
    from paretopipe.controller.zygote import Zygote

    base = Path(tempfile.mkdtemp())
    results: dict[str, list[float]] = {k: [] for k in ("list_cold", "list_warm", "worker_cold", "worker_warm", "import",
                                                       "worker_forked", "worker_daemon")}
    zygote = Zygote()
    try:
        for r in range(ROUNDS):
            cold = base / f"cold{r}"
            results["list_cold"].append(split_list(cold))
            results["list_warm"].append(split_list(cold))
            cold2 = base / f"cold-worker{r}"
            results["worker_cold"].append(worker_start(cold2))
            results["worker_warm"].append(worker_start(cold2))
            results["import"].append(import_floor())
            results["worker_forked"].append(worker_forked(zygote, cold2))
            if r == 0:
                worker_from_daemon(cold2)  # the host's first start: it starts the daemon
            results["worker_daemon"].append(worker_from_daemon(cold2))
    finally:
        zygote.close()
        _stop_daemons()
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{MODEL}, medians of {ROUNDS} alternating rounds (seconds):")
    print(f"  split --list   cold {med['list_cold']:6.2f}   warm {med['list_warm']:6.2f}   cold/warm "
          f"{med['list_cold'] / med['list_warm']:6.1f}x")
    print(f"  worker start   cold {med['worker_cold']:6.2f}   warm {med['worker_warm']:6.2f}   cold/warm "
          f"{med['worker_cold'] / med['worker_warm']:6.1f}x")
    print(f"  worker start forked from the zygote (warm) {med['worker_forked']:6.2f}   fresh/forked "
          f"{med['worker_warm'] / med['worker_forked']:6.1f}x")
    print(f"  worker start over a host's daemon (warm)   {med['worker_daemon']:6.2f}   fresh/daemon "
          f"{med['worker_warm'] / med['worker_daemon']:6.1f}x")
    print(f"  import torch + torchvision alone: {med['import']:.2f} s "
          f"({med['import'] / med['worker_warm']:.0%} of a warm worker start)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
