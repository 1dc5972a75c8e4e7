#!/usr/bin/env python3
"""Sweep overhead: wall time / time in measured batches, our sweeper vs a naive one.

Both sweep the same plan (MobileNetV2, 5 block splits, lan, 1 run, batch 2, 8 measured + 2
warm-up batches). Ours keeps one pinned worker per stage alive and re-partitions in place; the
naive sweep starts fresh partition1.py/partition2.py processes per configuration, as the anchor
does. Overhead = (wall - measured) / measured. Goal: ours under 0.25 for the demo-sized sweep.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SPLITS = [0, 4, 9, 14, 19]
ARGS = ["--batch-size", "2", "--num-batches", "8", "--warmup", "2"]


def ours(out: Path) -> tuple[float, float]:
    t0 = time.monotonic()
    subprocess.run([PY, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", ",".join(map(str, SPLITS)),
                    "--runs", "1", "--network", "lan", "--out", str(out), "--session", "s", "--no-report",
                    "--local", "--quiet", *ARGS], cwd=ROOT, check=True, capture_output=True)
    wall = time.monotonic() - t0
    measured = sum(json.loads(p.read_text())["summary"]["measured_window_s"] for p in (out / "s" / "runs").glob("*.json"))
    return wall, measured


def naive(out: Path) -> tuple[float, float]:
    t0 = time.monotonic()
    measured = 0.0
    for k in SPLITS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        common = ["--model-name", "mobilenetv2", "--split-index", str(k), "--port", port, "--threads", "1", "--quiet"]
        s1 = subprocess.Popen(["taskset", "-c", "0", PY, "partition1.py", *common, "--host", "127.0.0.1",
                               "--batch-size", "2", "--num-batches", "8", "--warmup", "2"], cwd=ROOT,
                              stdout=subprocess.DEVNULL)
        subprocess.run(["taskset", "-c", "1", PY, "partition2.py", *common, "--batch-size", "2", "--output-dir",
                        str(out / str(k))], cwd=ROOT, check=True, capture_output=True)
        s1.wait(120)
        measured += json.loads(next((out / str(k)).glob("*.json")).read_text())["summary"]["measured_window_s"]
    return time.monotonic() - t0, measured


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    w1, m1 = ours(tmp / "ours")
    w2, m2 = naive(tmp / "naive")
    print(f"ours : wall {w1:6.1f} s, measured {m1:6.1f} s, overhead {(w1 - m1) / m1:5.2f} x measured")
    print(f"naive: wall {w2:6.1f} s, measured {m2:6.1f} s, overhead {(w2 - m2) / m2:5.2f} x measured")
    print(f"naive/ours wall ratio {w2 / w1:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
