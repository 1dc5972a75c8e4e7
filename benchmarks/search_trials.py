#!/usr/bin/env python3
"""A measured search against measured sweeps: what a trial costs, and how much of the sweep's
front a search of a quarter of the space reaches.

- **Cost.** The same configurations (--cost-splits under lan) swept by ``automated_split_tester.py``
  and searched by ``paretopipe search --budget all``, each a fresh session, alternated: the
  search's wall time over the sweep's is what a trial costs in sweep configurations.
- **Coverage.** The whole space (--splits under each --network) swept, then searched with a budget
  of --share of it (the cost model's predictions first, from a profile of this machine for both
  stages, as the two emulated stages here are): the hypervolume of the front of the
  configurations the search chose, valued as the sweep measured them, over the sweep's front's
  (per network, then the median).

    python benchmarks/search_trials.py [--only cost|coverage] [--share 0.25] [--repetitions 3]
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

import numpy as np
import pandas as pd

from paretopipe.search import loop

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "results" / "benchmarks" / "search-trials-mobilenetv2.profile.json"
OBJECTIVES = {"latency_median_s": "min", "throughput_imgs_per_s": "max"}


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {proc.returncode}: {proc.stderr[-1500:]}")
    return time.perf_counter() - t0


def profile(model: str) -> Path:
    """This machine's profile of the model at batch 1 (measured once, cached)."""
    if not PROFILE.is_file():
        PROFILE.parent.mkdir(parents=True, exist_ok=True)
        timed([sys.executable, "-m", "paretopipe", "profile", "--model", model, "--threads", "1", "--quiet",
               "--out", str(PROFILE)])
    return PROFILE


def score(sweep: pd.DataFrame, chosen: list[dict]) -> float:
    """The median over networks of the chosen configurations' hypervolume (the sweep's values)
    over the sweep's own, both normalised to the sweep's range on that network."""
    ratios = []
    for network, rows in sweep.groupby("network"):
        values = rows[list(OBJECTIVES)].to_numpy(dtype=float)
        lower, upper = loop.bounds(values)
        senses = list(OBJECTIVES.values())
        picked = rows[rows["split_index"].astype(int).isin([c["split"] for c in chosen if c.get("network", network)
                                                            == network])]
        whole = loop.normalised_hypervolume(values, senses, lower, upper)
        ratios.append(loop.normalised_hypervolume(picked[list(OBJECTIVES)].to_numpy(dtype=float), senses, lower,
                                                  upper) / whole)
    return float(np.median(ratios))


def cost(args: argparse.Namespace, common: list[str]) -> float:
    """Sweep --cost-splits under lan, then search the same configurations (a budget of all of
    them): the median over repetitions of the search's wall time over the sweep's."""
    ratios = []
    for rep in range(args.repetitions):
        base = [*common, "--splits", args.cost_splits, "--network", "lan"]
        with tempfile.TemporaryDirectory(prefix="paretopipe-trials-") as tmp:
            sweep_s = timed([sys.executable, "automated_split_tester.py", *base, "--out", f"{tmp}/sweep"])
            search_s = timed([sys.executable, "-m", "paretopipe", "search", *base, "--budget", "all",
                              "--out", f"{tmp}/search"])
            doc = json.loads(Path(tmp, "search", "s", "search.json").read_text())
        ratios.append(search_s / sweep_s)
        print(f"cost {rep}: sweep of {len(doc['trials'])} configurations {sweep_s:.2f} s, search of them "
              f"{search_s:.2f} s ({doc['worker_groups_started']} worker group started): {ratios[-1]:.3f}", flush=True)
    return statistics.median(ratios)


def coverage(args: argparse.Namespace, common: list[str]) -> float:
    """Sweep --splits under --network, then search --share of that space, the predictions first:
    the median over repetitions of the search's score (:func:`score`)."""
    profiles = f"{profile(args.model)},{PROFILE}"
    scores = []
    for rep in range(args.repetitions):
        base = [*common, "--splits", args.splits, "--network", args.network]
        with tempfile.TemporaryDirectory(prefix="paretopipe-trials-") as tmp:
            timed([sys.executable, "automated_split_tester.py", *base, "--out", f"{tmp}/sweep"])
            sweep = pd.read_csv(Path(tmp, "sweep", "s", "summary.csv"))
            sweep = sweep[sweep["status"] == "complete"]
            budget = max(1, round(args.share * len(sweep)))
            timed([sys.executable, "-m", "paretopipe", "search", *base, "--budget", str(budget), "--device-profiles",
                   profiles, "--seed", str(rep), "--out", f"{tmp}/search"])
            doc = json.loads(Path(tmp, "search", "s", "search.json").read_text())
        scores.append(score(sweep, [t["config"] for t in doc["trials"]]))
        print(f"coverage {rep}: {budget} of {len(sweep)} configurations ({doc['predicted']} predicted) reach "
              f"{scores[-1]:.4f} of the sweep's hypervolume", flush=True)
    return statistics.median(scores)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--splits", default="all", help="the space the coverage is measured on")
    p.add_argument("--network", default="lan,lte")
    p.add_argument("--share", type=float, default=0.25, help="the search's budget, a share of the space")
    p.add_argument("--cost-splits", default="0,3,6,9,12,15,18,19", help="the configurations the cost is measured on")
    p.add_argument("--only", choices=("cost", "coverage"), default=None)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--num-batches", type=int, default=20)
    args = p.parse_args()
    common = ["--model", args.model, "--runs", str(args.runs), "--batch-size", "1", "--num-batches",
              str(args.num_batches), "--threads", "1", "--drift-every", "0", "--local", "--no-report", "--quiet",
              "--session", "s"]
    if args.only in (None, "cost"):
        print(f"search_trials: a trial costs {cost(args, common):.3f}x a sweep configuration (goal at most 1.2; "
              f"median of {args.repetitions})", flush=True)
    if args.only in (None, "coverage"):
        print(f"search_trials: with {args.share:.0%} of the space a search reaches {coverage(args, common):.4f} of "
              f"the sweep's hypervolume (goal 0.95; median of {args.repetitions})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
