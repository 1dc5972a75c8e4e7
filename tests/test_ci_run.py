""".ci/run, CI's entry point, with `make` replaced by a script that plays each target: a failing
`make test` ends the script, and with it the builds it started in the background (the aarch64
sysroot's and llama.cpp's: make, and whatever that started), instead of leaving them running."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from conftest import ROOT

FAKE_MAKE = """#!/bin/sh
case "$1" in
  lab-arm) echo $$ > "$MARK/build.pid"; cat /proc/self/autogroup > "$MARK/build.autogroup" 2>/dev/null; nice > "$MARK/build.nice"; sleep 300 & echo $! > "$MARK/child.pid"; wait ;;
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
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MARK": str(tmp_path), "TEST_RC": str(test_rc),
           "TMPDIR": str(tmp_path)}
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
    assert not list(tmp_path.glob("paretopipe-*")), "the build logs outlived .ci/run"


def test_the_builds_beside_the_tests_run_at_the_lowest_priority_in_an_autogroup_of_their_own(tmp_path):
    """nice 19 alone weighs nothing against the tests' session where the kernel groups by session
    (its autogroups): the build's session is set to 19 as well."""
    done, pids = _run_ci(tmp_path, test_rc=2)
    assert len(pids) == 4 and all(_gone(pid) for pid in pids)
    assert (tmp_path / "build.nice").read_text().split() == ["19"]
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("this kernel has no autogroups: it weighs processes by their nice alone")
    build, ours = (tmp_path / "build.autogroup").read_text().split(), open("/proc/self/autogroup").read().split()
    if not build or not ours:
        # The kernel prints nothing for a task left in the default group: a kernel (or a sandbox's
        # /proc) that gives a new session no autogroup of its own, where nice alone is what counts.
        pytest.skip(f"this kernel gives sessions no autogroup (ours: {ours}, the build's: {build})")
    assert build[-2:] == ["nice", "19"] and build[0] != ours[0], build
