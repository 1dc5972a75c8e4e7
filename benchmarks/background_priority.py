#!/usr/bin/env python3
"""What a build started beside the tests at "the lowest priority" leaves them (``.ci/run``).

Two busy processes here (the tests) run for DURATION_S beside two busy ones in a session of their
own at nice 19 (the builds), started two ways: ``setsid nice -n 19`` alone, and with that
session's autogroup set to 19 too (``.ci/run``'s ``lowest_priority``). Where the kernel groups the
CPU by session (``/proc/sys/kernel/sched_autogroup_enabled`` = 1), a process's nice counts only
inside its own session, so the first way gives the builds half the cores. Prints the CPU the busy
processes here got over what the cores could give them, for each way, and the ratio. On the 2-core
development VM (2026-12-01): 3.0 and 5.76 of 6 core-seconds.

    python benchmarks/background_priority.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

DURATION_S = 3.0
BUSY = "import time, sys\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def _background(autogroup: bool) -> subprocess.Popen:
    """Two busy processes in a new session at nice 19 (its autogroup at 19 too if ``autogroup``)."""
    line = (("echo 19 > /proc/self/autogroup; " if autogroup else "")
            + f"nice -n 19 {sys.executable} -c \"$0\" {DURATION_S + 2} & exec nice -n 19 {sys.executable} -c \"$0\" "
            f"{DURATION_S + 2}")
    return subprocess.Popen(["setsid", "bash", "-c", line, BUSY])


def foreground_share(autogroup: bool) -> float:
    """The CPU the busy processes here got, over what the cores could give them."""
    cores = min(2, os.cpu_count() or 1)
    background = _background(autogroup)
    time.sleep(0.5)  # both of its processes busy
    before = os.times()
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(DURATION_S)]) for _ in range(cores)]
    for proc in procs:
        proc.wait()
    after = os.times()
    background.wait()
    used = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return used / (cores * DURATION_S)


def main() -> int:
    enabled = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() \
        if os.path.exists("/proc/sys/kernel/sched_autogroup_enabled") else "absent"
    plain = foreground_share(False)
    grouped = foreground_share(True)
    print(f"autogroups: {enabled}; busy processes here got {plain:.2f} of the cores beside `setsid nice -n 19`, "
          f"{grouped:.2f} beside it with its autogroup at 19: {grouped / plain:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
