#!/usr/bin/env python3
"""RPC vs TCP overhead per batch on loopback: same model, same split, measured side by side.

MobileNetV2, batch 1, one torch thread per process, no link emulation. For a late cut (small
payload) and an early cut (large payload): median latency, RPC / TCP, sequential. Then the
pipelined (--in-flight 4) throughput ratio at the late cut. Runs alternate TCP, RPC, TCP, RPC
so drift hits both. Differences come from (a) RPC's extra hop: its master holds the data, so
the input image crosses a socket before stage 1 (the TCP stage 1 is the data source), and (b)
per-message cost: TensorPipe + RPC's Python pickling of arguments and future callbacks vs one
40-byte binary header and a sendmsg.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from stages import PY, ROOT, tcp_run
BATCHES = 30


def tcp(split: int, in_flight: int) -> dict:
    return tcp_run(split, ["--in-flight", str(in_flight)], BATCHES, warmup=3)


def rpc(split: int, in_flight: int, source: str = "master") -> dict:
    """``source``: master (the anchor's design: the master holds the data, one extra hop) or stage1
    (the data source on the first worker, as the TCP backend's stage 1 is)."""
    out = Path(tempfile.mkdtemp())
    cmd = [PY, "distributed_runner.py", "--local", "--world-size", "3", "--model", "mobilenetv2", "--split-block",
           str(split), "--batch-size", "1", "--num-test-samples", str(BATCHES), "--warmup", "3", "--threads", "1",
           "--metrics-dir", str(out), "--quiet", "--rpc-source", source]
    if in_flight > 1:
        cmd += ["--use-pipelining", "--in-flight", str(in_flight)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return json.loads(next(out.glob("*.json")).read_text())["summary"]


def main() -> int:
    for label, split in (("late cut k=17 (small payload)", 17), ("early cut k=2 (large payload)", 2)):
        runs: dict[str, list[float]] = {"tcp": [], "rpc": [], "rpc-src1": []}
        for _ in range(2):  # interleaved, so the machine's drift hits all three
            payload = tcp(split, 1)
            runs["tcp"].append(payload["latency_median_s"])
            runs["rpc"].append(rpc(split, 1)["latency_median_s"])
            runs["rpc-src1"].append(rpc(split, 1, "stage1")["latency_median_s"])
        tl, rl, sl = (statistics.median(runs[k]) for k in ("tcp", "rpc", "rpc-src1"))
        print(f"{label:<32} payload {payload['payload_bytes_mean']:>9.0f} B  tcp {tl * 1e3:7.2f} ms  rpc {rl * 1e3:7.2f} ms"
              f"  rpc/tcp {rl / tl:.2f}  rpc with the source on stage 1 {sl * 1e3:7.2f} ms, /tcp {sl / tl:.2f}")
    tp = [tcp(17, 4)["throughput_imgs_per_s"], rpc(17, 4)["throughput_imgs_per_s"],
          rpc(17, 4, "stage1")["throughput_imgs_per_s"]]
    print(f"pipelined (--in-flight 4, k=17): tcp {tp[0]:.1f} img/s, rpc {tp[1]:.1f} img/s (rpc/tcp {tp[1] / tp[0]:.2f}), "
          f"rpc with the source on stage 1 {tp[2]:.1f} img/s (/tcp {tp[2] / tp[0]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
