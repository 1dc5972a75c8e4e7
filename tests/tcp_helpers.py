"""Helpers to run both TCP stages: in one process (threads) or as real processes."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import PYTHON, ROOT
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import tcp
from paretopipe.transport.runconfig import RunConfig


@functools.lru_cache(maxsize=None)
def builder(name: str) -> StageBuilder:
    return StageBuilder(name)


def run_in_threads(name: str, split_index: int, tmp: Path, conditions=None, **cfg_kw):
    """Both stages in this process over 127.0.0.1; returns (stage-1 outcome, stage-2 outcome)."""
    b = builder(name)
    cuts = b.cuts_for(split_index)
    cfg = RunConfig(model=b.name, cuts=cuts, split_index=split_index, timeout_s=60,
                    link_mode="emulated" if conditions else "none",
                    network=conditions.name if conditions else None, **cfg_kw)
    listener = tcp.listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    out: dict = {}

    def stage1():
        try:
            out["s1"] = tcp.run_stage1(listener, b, cfg, conditions=conditions, connect_timeout=30,
                                       keep_outputs=True, output_dir=tmp / "s1")
        except BaseException as exc:  # surfaced by the caller
            out["s1_error"] = exc

    th = threading.Thread(target=stage1)
    th.start()
    sock = tcp.connect_with_retry("127.0.0.1", port, 10)
    s2 = tcp.run_stage2(sock, b, RunConfig(model=b.name, cuts=cuts, batch_size=cfg.batch_size, timeout_s=60),
                        output_dir=tmp)
    th.join(60)
    listener.close()
    if "s1_error" in out:
        raise out["s1_error"]
    return out["s1"], s2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTED: list[subprocess.Popen] = []


def start(script: str, *args: str, prefix: list[str] | None = None, env=None) -> subprocess.Popen:
    """Start a script in its own process group; conftest kills every group after each test."""
    proc = subprocess.Popen((prefix or []) + [PYTHON, str(ROOT / script), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    STARTED.append(proc)
    return proc


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    """Block until ``needle`` appears on the process's stderr (readiness, not a sleep)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"process exited early: {''.join(seen)}")
            continue
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not seen in {timeout}s: {''.join(seen)}")


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
