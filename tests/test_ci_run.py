""".ci/run, CI's entry point, with `make` replaced by a script that plays each target: a failing
`make test` ends the script, and with it the builds it started in the background (the aarch64
sysroot's and llama.cpp's: make, and whatever that started), instead of leaving them running."""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from conftest import ROOT

FAKE_MAKE = """#!/bin/sh
case "$1" in
  lab-arm) echo $$ > "$MARK/build.pid"; sleep 300 & echo $! > "$MARK/child.pid"; wait ;;
  llamacpp) echo $$ > "$MARK/peers.pid"; sleep 300 & echo $! > "$MARK/peers_child.pid"; wait ;;
  test) while [ ! -s "$MARK/child.pid" ] || [ ! -s "$MARK/peers_child.pid" ]; do sleep 0.05; done
        exit "$TEST_RC" ;;  # fails while the builds run
  *) exit 0 ;;
esac
"""


def _run_ci(tmp_path, test_rc: int) -> tuple[subprocess.CompletedProcess, list[int]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MARK": str(tmp_path), "TEST_RC": str(test_rc)}
    proc = subprocess.Popen(["bash", str(ROOT / ".ci" / "run")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    pids = [int((tmp_path / name).read_text()) for name in ("build.pid", "child.pid", "peers.pid", "peers_child.pid")
            if (tmp_path / name).exists()]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), pids


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_failing_make_test_ends_the_background_builds_with_it(tmp_path):
    done, pids = _run_ci(tmp_path, test_rc=2)
    assert done.returncode != 0
    assert len(pids) == 4, "a fake build never started"
    assert all(_gone(pid) for pid in pids), f"the background build outlived .ci/run: {pids}"
