#!/usr/bin/env python3
"""A profile's hop probe (``paretopipe.predict.hopprobe``) with its echo process forked and
spawned, side by side.

A spawned echo is a fresh interpreter that imports torch again; a forked one shares the profile's
imported state. Rounds alternate the two so the machine's drift hits both. Printed: the medians of
the probe's wall time, of its CPU (this process's and its children's, the echo's included once it
is joined) and of the half round trip it measures, and the spawned / forked ratios. The round trip
should be the same either way; the cost of getting it should not.

    python benchmarks/hop_probe.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def probe(start_method: str) -> tuple[float, float, float]:
    """(wall s, CPU s, half round trip s) of one probe."""
    from paretopipe.predict.hopprobe import hop_fixed_s

    wall0, cpu0 = time.monotonic(), _cpu_s()
    hop = hop_fixed_s(start_method=start_method)
    return time.monotonic() - wall0, _cpu_s() - cpu0, hop


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)  # as the profile's --threads 1
    results: dict[str, list[tuple[float, float, float]]] = {"fork": [], "spawn": []}
    for _ in range(args.rounds):
        for method in results:
            results[method].append(probe(method))
    med = {m: [statistics.median(r[i] for r in rows) for i in range(3)] for m, rows in results.items()}
    for m, (wall, cpu, hop) in med.items():
        print(f"{m:5s}: probe {wall:.2f} s wall, {cpu:.2f} s CPU; half round trip {hop * 1e6:.0f} us "
              f"(median of {args.rounds})")
    f, s = med["fork"], med["spawn"]
    print(f"spawned / forked: wall {s[0] / f[0]:.1f}x, CPU {s[1] / f[1]:.1f}x, half round trip {s[2] / f[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
