"""Shared by the benchmarks: one 2-stage TCP run as two pinned processes, returning its summary."""

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


def tcp_run(split: int, stage1_args: list[str], batches: int, warmup: int, batch_size: int = 1) -> dict:
    """partition1.py on core 0 and partition2.py on core 1 (one torch thread each); the run's summary."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = Path(tempfile.mkdtemp())
    common = ["--model-name", "mobilenetv2", "--split-index", str(split), "--port", port, "--batch-size",
              str(batch_size), "--threads", "1", "--quiet"]
    pin = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) if (os.cpu_count() or 1) >= 2 else ([], [])
    s1 = subprocess.Popen(pin[0] + [PY, "partition1.py", *common, "--host", "127.0.0.1", "--num-batches",
                                    str(batches), "--warmup", str(warmup), *stage1_args], cwd=ROOT,
                          stdout=subprocess.DEVNULL)
    s2 = subprocess.run(pin[1] + [PY, "partition2.py", *common, "--output-dir", str(out)], cwd=ROOT,
                        capture_output=True, text=True)
    s1.wait(120)
    if s2.returncode:
        raise SystemExit(s2.stderr)
    return json.loads(next(out.glob("*.json")).read_text())["summary"]
