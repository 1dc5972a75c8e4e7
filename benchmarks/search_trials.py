#!/usr/bin/env python3
"""What a search's trial costs against a sweep's configuration: the same configurations measured
by ``automated_split_tester.py`` (one sweep) and by ``paretopipe search --budget N`` (N trials on
one sweeper, whose worker group the trials share), alternated on this machine, each a fresh
session; prints each pair's wall times and the median ratio of the search's to the sweep's.

    python benchmarks/search_trials.py [--splits 0,3,6,9,12,15,18,19] [--repetitions 3] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {proc.returncode}: {proc.stderr[-1500:]}")
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--splits", default="0,3,6,9,12,15,18,19")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--num-batches", type=int, default=20)
    args = p.parse_args()
    n = len(args.splits.split(","))
    common = ["--model", args.model, "--splits", args.splits, "--network", "lan", "--runs", str(args.runs),
              "--batch-size", "1", "--num-batches", str(args.num_batches), "--threads", "1", "--drift-every", "0",
              "--local", "--no-report", "--quiet", "--session", "s"]
    ratios = []
    for rep in range(args.repetitions):
        with tempfile.TemporaryDirectory(prefix="paretopipe-trials-") as tmp:
            sweep_s = timed([sys.executable, "automated_split_tester.py", *common, "--out", f"{tmp}/sweep"])
            search_s = timed([sys.executable, "-m", "paretopipe", "search", *common, "--budget", str(n),
                              "--out", f"{tmp}/search"])
            doc = json.loads(Path(tmp, "search", "s", "search.json").read_text())
        ratios.append(search_s / sweep_s)
        print(f"repetition {rep}: sweep of {n} configurations {sweep_s:.2f} s, search of {n} trials {search_s:.2f} s "
              f"({doc['worker_groups_started']} worker group started), ratio {ratios[-1]:.3f}", flush=True)
    print(f"search_trials: a trial costs {statistics.median(ratios):.3f}x a sweep configuration "
          f"(median of {len(ratios)}; {n} configurations, {args.runs} runs each, goal at most 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
