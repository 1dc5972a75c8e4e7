#!/usr/bin/env python3
"""Run every benchmark in this folder; each prints its own side-by-side ratios."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for name in ("transport.py", "pipelining.py", "rpc_vs_tcp.py", "sweep_overhead.py", "planner.py", "noise_floor.py",
             "prefetch.py", "llm_bound.py", "search.py", "search_trials.py", "engines.py", "relay.py"):
    print(f"== {name}", flush=True)
    subprocess.run([sys.executable, str(HERE / name)], check=True)
