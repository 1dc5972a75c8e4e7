#!/usr/bin/env python3
"""Stage compute in a run over the profiled time, per split, at one and four batches in flight.

A device profile (``paretopipe profile``) times each segment of the model in one thread of a quiet
process; the cost model adds the segments of a stage up. A stage in a sweep computes the same
segments in a worker process that also sends, receives and samples. This benchmark profiles
MobileNetV2 on core 0 (one thread, as ``make demo`` does), sweeps a few block splits on lan with the
demo's pinning, and prints stage 1's and stage 2's median compute over what the profile predicts
for them, at ``--in-flight 1`` and ``4``. Goal: every ratio within 1.00 +- 0.10. The profile is taken
before and after the sweep and averaged, as ``make demo`` does (the machine drifts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from paretopipe.predict.device_profile import DeviceProfile, average

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

SPLITS = [0, 4, 10, 15, 19]


def profile(out: Path, cpus: str) -> DeviceProfile:
    subprocess.run([PY, "-m", "paretopipe.profile", "--model", "mobilenetv2", "--threads", "1", "--codecs",
                    "float32/none", "--ciphers", "none", "--quiet", "--cpus", cpus, "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    return DeviceProfile.load(out)


def sweep(out: Path, in_flight: int, batches: int) -> list[dict]:
    subprocess.run([PY, "automated_split_tester.py", "--model", "mobilenetv2", "--splits",
                    ",".join(map(str, SPLITS)), "--runs", "1", "--network", "lan", "--batch-size", "1",
                    "--num-batches", str(batches), "--warmup", "2", "--in-flight", str(in_flight), "--local",
                    "--no-report", "--quiet", "--out", str(out), "--session", "s"], cwd=ROOT, check=True,
                   capture_output=True)
    return [json.loads(p.read_text()) for p in sorted((out / "s" / "runs").glob("*.json"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=30, help="measured batches per run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    # Stage 1 runs on core 0 and stage 2 on core 1 (the sweep's local placement).
    before = [profile(tmp / "p0-before.json", "0"), profile(tmp / "p1-before.json", "1")]
    runs = {w: sweep(tmp / f"w{w}", w, args.batches) for w in (1, 4)}
    after = [profile(tmp / "p0-after.json", "0"), profile(tmp / "p1-after.json", "1")]
    stage1, stage2 = average([before[0], after[0]]), average([before[1], after[1]])
    rows, ratios = [], []
    for w, records in runs.items():
        for rec in sorted(records, key=lambda r: r["config"]["split_index"]):
            k = rec["config"]["split_index"]
            b = stage1.blocks[k]
            s = rec["summary"]
            last = stage2.blocks[max(stage2.blocks)]
            pred = (stage1.stage_compute_s(1, 0, b) if b > 0 else 0.0,
                    stage2.stage_compute_s(1, b, last) if b < last else 0.0)
            got = (s.get("stage1_compute_median_s") or 0.0, s.get("stage2_compute_median_s") or 0.0)
            r = [g / p if p > 1e-4 else None for g, p in zip(got, pred)]
            ratios += [x for x in r if x is not None]
            rows.append((w, k, got, pred, r))
    print(f"{'in-flight':>9} {'k':>3} {'stage1 run/profile':>26} {'stage2 run/profile':>26}")
    for w, k, got, pred, r in rows:
        cell = [f"{g * 1e3:6.2f}/{p * 1e3:6.2f} ms = {x:4.2f}" if x is not None else f"{'-':>24}"
                for g, p, x in zip(got, pred, r)]
        print(f"{w:>9} {k:>3} {cell[0]:>26} {cell[1]:>26}")
    ratios.sort()
    print(f"stage/profile: median {ratios[len(ratios) // 2]:.2f}, range {ratios[0]:.2f}..{ratios[-1]:.2f} "
          f"(goal: within 1.00 +- 0.10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
