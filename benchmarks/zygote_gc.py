#!/usr/bin/env python3
"""A stage's full garbage collection in a fork of a sweep's zygote: with the zygote's objects frozen
before the fork (``gc.freeze``, as the zygote serves), and unfrozen in the child (what every stage
paid before), side by side.

A stage forked from a zygote that imported torch, torchvision and a language model's code holds
about half a million objects it never frees. Its first full collection (which the allocations of
building a model trigger) walked all of them, and wrote to each one's header, so every page it
touched was copied out of the zygote's. Each round forks one child of each kind from the same
zygote; each child times ``gc.collect()`` and counts the page faults it took. Medians of the
alternating rounds and their ratios are printed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROUNDS = 7
CHILD = '''
import gc, json, resource, sys, time
if sys.argv[1] == "unfrozen":
    gc.unfreeze()
before = resource.getrusage(resource.RUSAGE_SELF)
t0, c0 = time.perf_counter(), time.process_time()
gc.collect()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before.ru_minflt
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "page_faults": faults}), flush=True)
'''


def collect_in_child(zygote, script: Path, kind: str) -> dict[str, float]:
    child = zygote.spawn(None, [kind], dict(os.environ), script=str(script))
    line = child.stdout.readline()
    child.stdin.close()
    assert child.wait(60) == 0, child.stderr.read()
    return json.loads(line)


def main() -> int:
    from paretopipe.controller.zygote import PRELOAD, Zygote
    from paretopipe.workload import GENERATION

    script = Path(tempfile.mkdtemp()) / "gc_child.py"
    script.write_text(CHILD)
    zygote = Zygote(PRELOAD)
    zygote.preload_more(GENERATION.preload)
    results: dict[str, list[dict[str, float]]] = {"frozen": [], "unfrozen": []}
    try:
        zygote.warm()
        collect_in_child(zygote, script, "frozen")  # the import request is served before this fork
        for _ in range(ROUNDS):
            for kind in results:
                results[kind].append(collect_in_child(zygote, script, kind))
    finally:
        zygote.close()
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s", "page_faults")}
           for k, v in results.items()}
    print(f"gc.collect() in a stage forked from a zygote holding torch, torchvision and the LM code: "
          f"medians of {ROUNDS} alternating rounds")
    for kind, m in med.items():
        print(f"  {kind:<9} wall {m['wall_s'] * 1e3:7.1f} ms   CPU {m['cpu_s'] * 1e3:7.1f} ms   "
              f"page faults {m['page_faults']:7.0f}")
    print(f"  unfrozen/frozen: CPU {med['unfrozen']['cpu_s'] / max(med['frozen']['cpu_s'], 1e-6):.0f}x, "
          f"page faults {med['unfrozen']['page_faults'] / max(med['frozen']['page_faults'], 1):.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
