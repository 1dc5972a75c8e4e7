#!/usr/bin/env python3
"""A language model's stage forked from a sweep's zygote, with and without its workload's modules
imported by the zygote first (``Workload.preload``: transformers and the Llama and Qwen2 code), side
by side.

Each start forks a child that builds stage 1 of ``tiny-lm`` split at block 2 on one thread, as a
stage worker does on its first run, and prints its own CPU seconds. Rounds alternate the two
zygotes so the machine's drift hits both; the medians of wall time to the built stage and of the
stage's CPU, and their ratios, are printed. The zygotes' own start is left out: a sweep pays it
once, its stages pay the rest every time.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 5
STAGE = '''
import json, resource, sys
import torch
torch.set_num_threads(1)
from paretopipe.llm.builder import LMBuilder
builder = LMBuilder("tiny-lm")
builder.stage(builder.cuts_for(2), 0)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)
'''


def stage_start(zygote, script: Path) -> tuple[float, float]:
    """Wall seconds from the fork to the built stage, and the stage process's CPU seconds."""
    t0 = time.monotonic()
    child = zygote.spawn(None, [], dict(os.environ), script=str(script))
    line = child.stdout.readline()
    wall = time.monotonic() - t0
    child.stdin.close()
    assert child.wait(60) == 0, child.stderr.read()
    return wall, json.loads(line)["cpu_s"]


def main() -> int:
    from paretopipe.controller.zygote import PRELOAD, Zygote
    from paretopipe.workload import GENERATION

    script = Path(tempfile.mkdtemp()) / "lm_stage.py"
    script.write_text(STAGE)
    plain, preloaded = Zygote(PRELOAD), Zygote(PRELOAD)
    preloaded.preload_more(GENERATION.preload)
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "preloaded": []}
    try:
        for zygote in (plain, preloaded):
            zygote.warm()
        stage_start(preloaded, script)  # the import request is served before this fork
        for _ in range(ROUNDS):
            results["plain"].append(stage_start(plain, script))
            results["preloaded"].append(stage_start(preloaded, script))
    finally:
        plain.close()
        preloaded.close()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    print(f"tiny-lm stage 1 of split 2, built in a fork of a sweep's zygote: medians of {ROUNDS} alternating rounds")
    for name, (wall, cpu) in med.items():
        print(f"  {name:<10} wall {wall:6.2f} s   stage CPU {cpu:6.2f} s")
    print(f"  plain/preloaded: wall {med['plain'][0] / med['preloaded'][0]:.1f}x, "
          f"CPU {med['plain'][1] / med['preloaded'][1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
