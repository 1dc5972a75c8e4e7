"""A lab's daemons are found by the lab's marker in their command line and stopped, and nobody
else's process is touched (controller/lab_processes.py), with real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from paretopipe.controller.lab_processes import is_marked, stop_marked

SLEEP = "import time; time.sleep(60)"


def test_the_marked_process_is_stopped_and_an_unmarked_one_of_the_same_program_is_not(tmp_path):
    marker = str(tmp_path / "lab-sshd_config")
    ours = subprocess.Popen([sys.executable, "-c", SLEEP, marker])
    theirs = subprocess.Popen([sys.executable, "-c", SLEEP, str(tmp_path / "someone-else")])
    try:
        program = sys.executable.rsplit("/", 1)[-1].encode()
        for proc in (ours, theirs):  # Popen can return (at exec's close-on-exec) before the kernel sets argv
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
        assert is_marked(ours.pid, program, marker.encode()) and not is_marked(theirs.pid, program, marker.encode())
        stopped = stop_marked(program, marker.encode(), [])
        assert stopped == [f"{program.decode()} {ours.pid}"]
        assert ours.wait(timeout=5) == -15  # SIGTERM; its command line was gone when stop_marked returned
        assert theirs.poll() is None
        assert not is_marked(ours.pid, program, marker.encode())
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()
