#!/usr/bin/env python3
"""Ours (``adaptive``) and SCIoT's rule (``sciot``) against the best static split in hindsight,
when the link changes, when a device changes, and when both do.

MobileNetV2 at batch 1, one torch thread per stage, each scenario its own sweep in which every
configuration of run r replays the same seeded stretch of its traces, and the policies choose
among the scenario's static splits:

- ``link``: the shipped step trace (40 and 2 Mbit/s, 4 s each), stage 1 at a quarter of a core
  and stage 2 at a full one (an edge device and a server), devices steady;
- ``throttle``: a loopback link, stage 1 on a full core following the Pi 4 throttling trace
  (to 40%), stage 2 at 70% of a core: local wins until stage 1 throttles;
- ``neighbour``: a loopback link, stage 1 at half a core, stage 2 following the noisy-neighbour
  trace (down to 20%): offloading wins until the neighbour takes the server's core;
- ``both``: the throttling trace on stage 1 and a link stepping between 1000 and 20 Mbit/s every
  6 s: offloading pays only while stage 1 is throttled and the link is fast.

The compute traces are the shipped ones time-compressed tenfold (a minute at 40% becomes 6 s), so
that a run meets a whole period; the copies and the network file are written beside the results.
Printed per scenario: the best static split, each policy's median over it and over the split it
started with, and how many batches each took to switch after a change it answered (median over the
changes). The medians are the report's: time-weighted over the span of trace time every
configuration covered (``compared_by``; analysis/adaptive_comparison.py says why a median over
batches misleads under a trace). ``ours/best_by_batches`` keeps the median over batches beside it
(the same best static split's).

    python benchmarks/device_adaptation.py [--out results/device-adaptation] [--runs 1] [--only throttle,both]
        [--batches N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from paretopipe.compute import cputrace

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "paretopipe" / "network" / "traces"
COMPRESS = 10.0
#: name -> (network table, --stage-cpu, static splits, batches per run)
SCENARIOS = {
    "link": ('trace = "{step}"', "0.25,1", "8,12,15,17,19", 120),
    "throttle": ('cpu_trace_stage1 = "{throttle}"', "1,0.7", "0,8,15,18,19", 450),
    "neighbour": ('cpu_trace_stage2 = "{neighbour}"', "0.5,1", "0,8,15,18,19", 450),
    "both": ('trace = "{fast_slow}"\ncpu_trace_stage1 = "{throttle}"', "1,0.7", "0,15,18,19", 300),
}


def compressed(name: str, out: Path) -> Path:
    """The shipped compute trace ``name`` with its times divided by ``COMPRESS``."""
    trace = cputrace.load(SHIPPED / "cpu" / f"{name}.csv")
    path = out / f"{name}-x{COMPRESS:g}.csv"
    rows = "".join(f"{t / COMPRESS:g},{s:g}\n" for t, s in zip(trace.times_s, trace.shares))
    path.write_text(f"# {name}.csv with times divided by {COMPRESS:g}\ntime_s,cpu_share\n{rows}")
    return path


def network_file(out: Path) -> Path:
    fast_slow = out / "fast-slow.csv"
    fast_slow.write_text("time_s,rate_mbit\n0,1000\n6,20\n")
    files = {"step": SHIPPED / "step.csv", "throttle": compressed("pi4-throttle", out),
             "neighbour": compressed("noisy-neighbour", out), "fast_slow": fast_slow}
    path = out / "networks.toml"
    path.write_text("".join(f"[{name}]\n{table.format(**files)}\n\n" for name, (table, *_) in SCENARIOS.items()))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "device-adaptation"))
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--only", default=None, help="comma list of scenarios: " + ",".join(SCENARIOS))
    p.add_argument("--batches", type=int, default=None, help="batches per run in every scenario (default: each "
                   "scenario's own, enough for a whole period of its traces)")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    netfile = network_file(out)
    rows = []
    for name, (_, shares, splits, batches) in SCENARIOS.items():
        if args.only and name not in args.only.split(","):
            continue
        session = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        cmd = [sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits",
               f"{splits},adaptive,sciot", "--network", name, "--network-file", str(netfile), "--stage-cpu", shares,
               "--threads", "1", "--batch-size", "1", "--num-batches", str(args.batches or batches), "--warmup", "2",
               "--runs", str(args.runs), "--local", "--drift-every", "0", "--timeout", "120", "--out", str(out),
               "--session", session, "--quiet"]
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        verdicts = out / session / "report" / "adaptive_verdicts.csv"
        if done.returncode != 0 or not verdicts.exists():
            print(f"{name}: sweep failed ({done.returncode}): {done.stderr.strip()[-600:]}", file=sys.stderr)
            continue
        v = pd.read_csv(verdicts).iloc[0]
        stat = "latency_span_median_s" if v["compared_by"].startswith("time") else "latency_median_s"
        rows.append({"scenario": name, "stage_cpu": shares, "best_static_k": v["best_static_split"],
                     "best_static_ms": 1e3 * v[f"best_static_{stat}"],
                     "ours_ms": 1e3 * v[f"adaptive_{stat}"], "ours/best": v["adaptive_over_best_latency"],
                     "ours/start": v["adaptive_over_start_latency"], "ours_react": v["adaptive_reaction_batches_median"],
                     "sciot_ms": 1e3 * v[f"sciot_{stat}"], "sciot/best": v["sciot_over_best_latency"],
                     "sciot/start": v["sciot_over_start_latency"], "sciot_react": v["sciot_reaction_batches_median"],
                     "ours/best_by_batches": v["adaptive_latency_median_s"] / v["best_static_latency_median_s"],
                     "compared_by": v["compared_by"], "sweep_s": round(wall)})
        print(f"{name}: done in {wall:.0f} s ({out / session})", file=sys.stderr)
    if not rows:
        return 1
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    print(table.round(3).to_string(index=False))
    for who, col in (("ours", "ours/best"), ("sciot", "sciot/best")):
        print(f"{who}: within 10% of the best static split in {int((table[col] <= 1.1).sum())}/{len(table)} "
              f"scenarios, better in {int((table[col] < 1).sum())}")
    table.to_csv(out / "device_adaptation.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
