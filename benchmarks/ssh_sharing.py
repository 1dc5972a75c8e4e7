#!/usr/bin/env python3
"""What sharing one SSH connection per host saves: short commands to a lab host, shared and not.

A sweep on hosts runs tens of short commands on each host per configuration (tc and ip for the
link, a worker's kill, its checks). Each is an ``ssh``; without a shared connection each pays a
key exchange. On a lab of two namespace hosts with their own sshd (``paretopipe lab``: needs
root), this runs ``--commands`` ``true`` commands to host 1 with sharing on and off, alternating
within each round (the order flips every round: this VM's speed swings), and prints the median
per command of the wall time and of this side's CPU (the ``ssh`` clients'), and their ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time

from paretopipe import sshcmd
from paretopipe.envfile import read_env
from paretopipe.controller import lab
from paretopipe.controller.hosts import Testbed


def _commands(host, n: int, shared: bool) -> tuple[float, float]:
    """Seconds of wall time and of the clients' CPU per command."""
    os.environ[sshcmd.SHARE_ENV] = "1" if shared else "0"
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    for _ in range(n):
        subprocess.run(host.ssh() + ["true"], check=True, capture_output=True, timeout=60)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    sshcmd.close_shared(host.target, host.key, host.ssh_port, host.known_hosts)  # each round opens its own
    return wall / n, cpu / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--commands", type=int, default=20)
    args = p.parse_args()
    made = lab.up("ppbssh", 2, 97)
    try:
        host = Testbed.from_env(read_env(str(made.env_file))).hosts[0]
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.rounds):
            for shared in ((True, False) if r % 2 == 0 else (False, True)):
                runs[shared].append(_commands(host, args.commands, shared))
    finally:
        lab.down("ppbssh")
    med = {s: [statistics.median(x[i] for x in runs[s]) for i in (0, 1)] for s in runs}
    for i, what in enumerate(("wall", "client CPU")):
        print(f"ssh_sharing: {what} per command, shared {med[True][i] * 1e3:.1f} ms, not shared "
              f"{med[False][i] * 1e3:.1f} ms: not/shared {med[False][i] / med[True][i]:.1f}x")


if __name__ == "__main__":
    main()
