#!/usr/bin/env python3
"""Pipelining efficiency: measured throughput vs the bound 1 / max(stage 1, link, stage 2).

Two real processes (partition1.py, partition2.py), one core and one torch thread each, with
--in-flight 4. Case A: the link dominates (emulated 20 Mbit/s: serialisation time = wire bytes x
8 / rate). Case B: stage-1 compute dominates (late split, no shaping). The stage times are the
medians the run measured itself; efficiency = measured batches/s x max(term). Goal >= 0.9.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run(split: int, profile_args: list[str], rate_bps: float | None, batches: int = 24) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = Path(tempfile.mkdtemp())
    common = ["--model-name", "mobilenetv2", "--split-index", str(split), "--port", port, "--batch-size", "2",
              "--threads", "1", "--quiet"]
    cores = os.cpu_count() or 1
    pin = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) if cores >= 2 else ([], [])
    s1 = subprocess.Popen(pin[0] + [PY, "partition1.py", *common, "--host", "127.0.0.1", "--num-batches",
                                    str(batches), "--warmup", "4", "--in-flight", "4", *profile_args],
                          cwd=ROOT, stdout=subprocess.DEVNULL)
    s2 = subprocess.run(pin[1] + [PY, "partition2.py", *common, "--output-dir", str(out)], cwd=ROOT,
                        capture_output=True, text=True)
    s1.wait(120)
    if s2.returncode:
        raise SystemExit(s2.stderr)
    rec = json.loads(next(out.glob("*.json")).read_text())
    s = rec["summary"]
    link = (s["wire_bytes_mean"] * 8 / rate_bps) if rate_bps else 0.0
    terms = {"stage1": s["stage1_compute_median_s"] + s["stage1_encode_median_s"], "link": link,
             "stage2": s["stage2_compute_median_s"] + s["stage2_decode_median_s"]}
    bound = max(terms.values())
    measured = s["throughput_imgs_per_s"] / 2  # batches per second
    return {"terms_ms": {k: round(v * 1e3, 1) for k, v in terms.items()}, "bottleneck": max(terms, key=terms.get),
            "measured_batches_per_s": measured, "bound_batches_per_s": 1 / bound, "efficiency": measured * bound}


def main() -> int:
    cases = [("link-bound (k=3, 20 Mbit/s)", 3, ["--rate", "20mbit"], 20e6),
             ("stage-1-bound (k=16, no shaping)", 16, [], None)]
    results = []
    for label, split, args, rate in cases:
        r = run(split, args, rate)
        results.append(r["efficiency"])
        print(f"{label:<34} terms {r['terms_ms']} bottleneck {r['bottleneck']:<7} "
              f"measured {r['measured_batches_per_s']:.2f} b/s, bound {r['bound_batches_per_s']:.2f} b/s, "
              f"efficiency {r['efficiency']:.2f}")
    print(f"min efficiency {min(results):.2f} (goal >= 0.9 where one term clearly dominates)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
