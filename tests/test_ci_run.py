""".ci/run, CI's entry point, with `make` replaced by a script that plays each target: a failing
`make test` ends the script, and with it the aarch64 sysroot build it started in the background
(make, and whatever that started), instead of leaving it running."""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from conftest import ROOT

FAKE_MAKE = """#!/bin/sh
case "$1" in
  lab-arm) echo $$ > "$MARK/build.pid"; sleep 300 & echo $! > "$MARK/child.pid"; wait ;;
  test) while [ ! -s "$MARK/child.pid" ]; do sleep 0.05; done; exit "$TEST_RC" ;;  # fails while the build runs
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
    pids = [int((tmp_path / name).read_text()) for name in ("build.pid", "child.pid") if (tmp_path / name).exists()]
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


def test_a_failing_make_test_ends_the_background_sysroot_build_with_it(tmp_path):
    done, pids = _run_ci(tmp_path, test_rc=2)
    assert done.returncode != 0
    assert len(pids) == 2, "the fake build never started"
    assert all(_gone(pid) for pid in pids), f"the background build outlived .ci/run: {pids}"
