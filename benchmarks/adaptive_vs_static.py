#!/usr/bin/env python3
"""Adaptive split vs every static split, under each shipped and each shared (recorded) trace.

For each trace, one sweep runs the static splits and ``adaptive``, every configuration of run r
with the same seeded trace offset, MobileNetV2 at batch 1, stage 1 at a quarter of a core (an edge device) and
stage 2 at a full core (a server), with the emulated link replaying the trace exactly. The
adaptive runtime may choose among the same static splits. Printed per trace: the best static
split in hindsight, medians, p95s, throughput, and the goal (adaptive's median latency within 10%
of the best static split's, and better than it on at least one trace).

Early splits send up to 1.6 MB per image; on uplinks below 10 Mbit/s on average (the recorded
ATT and Verizon traces, the Markov model) they take seconds per batch, so there the static set
starts at k=8. Traces from ../shared/traces are read in place (GPL: never copied); absent, they are
skipped. Figures and tables land in each session's report/ (adaptive_*.png, adaptive.csv).

    python benchmarks/adaptive_vs_static.py [--out results/adaptive-bench] [--batches 60] [--runs 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from paretopipe.network import traces as tr

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
SHIPPED = ROOT / "paretopipe" / "network" / "traces"
FAST_SPLITS = "0,4,8,12,15,17,19"
SLOW_SPLITS = "8,12,15,17,19"


def traces() -> list[tuple[str, Path, Path]]:
    """(name, up, down) for every trace: a CSV drives both directions, Mahimahi pairs .up/.down."""
    out = [("step", SHIPPED / "step.csv", SHIPPED / "step.csv"),
           ("markov-cellular", SHIPPED / "markov-cellular.up", SHIPPED / "markov-cellular.down")]
    if SHARED.is_dir():
        for up in sorted(SHARED.glob("*.up")):
            down = up.with_suffix(".down")
            if down.exists():
                out.append((up.stem, up, down))
    else:
        print(f"note: {SHARED} is absent; the recorded traces are skipped", file=sys.stderr)
    return out


def mean_up_mbit(path: Path) -> float:
    return tr.load(path).mean_rate_bps / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "adaptive-bench"))
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--runs", type=int, default=1,
                   help="runs per split, in seeded interleaved rounds (each round its own trace offset); the "
                        "summary medians are over runs")
    p.add_argument("--only", default=None, help="comma list of trace names")
    p.add_argument("--splits", default=None, help="the static splits to compare, e.g. 15,19 (default: "
                   f"{FAST_SPLITS} on a trace whose uplink averages 10 Mbit/s or more, else {SLOW_SPLITS})")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, up, down in traces():
        if args.only and name not in args.only.split(","):
            continue
        netfile = out / f"{name}.toml"
        netfile.write_text(f'[trace-{name}]\ntrace_up = "{up}"\ntrace_down = "{down}"\n')
        splits = args.splits or (FAST_SPLITS if mean_up_mbit(up) >= 10 else SLOW_SPLITS)
        t0 = time.monotonic()
        cmd = [sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", f"{splits},adaptive",
               "--network", f"trace-{name}", "--network-file", str(netfile), "--stage-cpu", "0.25,1",
               "--batch-size", "1", "--num-batches", str(args.batches), "--warmup", "2", "--runs", str(args.runs),
               "--local", "--drift-every", "0", "--timeout", "120", "--out", str(out), "--session", name, "--quiet"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        verdicts = out / name / "report" / "adaptive_verdicts.csv"
        if done.returncode != 0 or not verdicts.exists():
            print(f"{name}: sweep failed ({done.returncode}): {done.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        v = pd.read_csv(verdicts).iloc[0].to_dict()
        # The report's statistic (time-weighted over the common span when the records are there).
        stat = "latency_span_median_s" if str(v["compared_by"]).startswith("time") else "latency_median_s"
        rows.append({"trace": name, "mean_up_mbit": round(mean_up_mbit(up), 2), "static_splits": splits,
                     "best_static_k": v["best_static_split"],
                     "best_static_median_ms": 1e3 * v[f"best_static_{stat}"],
                     "adaptive_median_ms": 1e3 * v[f"adaptive_{stat}"],
                     "ratio": v["adaptive_over_best_latency"],
                     "best_static_p95_ms": 1e3 * v["best_static_latency_p95_s"],
                     "adaptive_p95_ms": 1e3 * v["adaptive_latency_p95_s"],
                     "best_static_imgs_per_s": v["best_static_throughput_imgs_per_s"],
                     "adaptive_imgs_per_s": v["adaptive_throughput_imgs_per_s"],
                     "within_10pct": v["within_goal"], "sweep_wall_s": round(wall)})
        print(f"{name}: done in {wall:.0f} s", file=sys.stderr)
    if not rows:
        return 1
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    print(table.round(2).to_string(index=False))
    within = bool(table["within_10pct"].all())
    beats = bool((table["ratio"] < 1).any())
    print(f"goal: adaptive within 10% of the best static split on every trace: {'met' if within else 'NOT met'} "
          f"({int(table['within_10pct'].sum())}/{len(table)}); beats it on at least one: {'met' if beats else 'NOT met'}")
    table.to_csv(out / "adaptive_vs_static.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
