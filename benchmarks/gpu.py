#!/usr/bin/env python3
"""A CPU stage 1 and a CUDA stage 2 at every block split of a model, side by side in one run: per
split, stage 1's CPU compute, the activation's bytes and their time at a link's rate, the
host-to-device copy and the CUDA stage's compute (CUDA events, the stage's own timer), at batch 1
and 32; then each split's latency per batch (stage 1 + wire + copy + stage 2, one batch in
flight) against the whole model on the CPU, and the best split's speed-up.

The wire is the activation's bytes over ``--rate-mbit`` (computed from the bytes, not measured:
the link is the testbed's), and the CPU stage uses ``--threads`` torch threads. Medians of
``--repetitions`` timed passes after warm-up. Prints a table; ``--json`` writes the rows too.

    python benchmarks/gpu.py                                  # mobilenetv2, batches 1 and 32, 1 Gbit/s
    python benchmarks/gpu.py --model resnet18 --rate-mbit 100 --json gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path



def _median_time(fn, repetitions: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repetitions):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(model: str, batch: int, rate_mbit: float, repetitions: int) -> list[dict]:
    import torch

    from paretopipe.partition.activation import activation_nbytes, call_stage
    from paretopipe.partition.stages import StageBuilder, StageTimer
    from paretopipe.transport.inputs import synthetic_batch

    cpu, gpu = StageBuilder(model), StageBuilder(model, device="cuda")
    x = synthetic_batch(0, batch, cpu.input_size)
    timer = StageTimer("cuda")
    with torch.no_grad():
        for _ in range(3):
            cpu.model(x)
        whole_cpu, _ = _median_time(lambda: cpu.model(x), repetitions)
    rows = []
    for k in range(cpu.partitioner.num_blocks + 1):
        cuts = cpu.cuts_for(k)
        s1, s2 = cpu.stage(cuts, 0), gpu.stage(cuts, 1)
        with torch.no_grad():
            call_stage(s1, x)
            s1_s, middle = _median_time(lambda: call_stage(s1, x), repetitions)
        nbytes = activation_nbytes(middle)
        for _ in range(3):
            timer.run(s2, middle, "cuda")
        copies, computes = [], []
        for _ in range(repetitions):
            _, seconds = timer.run(s2, middle, "cuda")
            copies.append(timer.last_copy_s)
            computes.append(seconds - timer.last_copy_s)
        wire_s = 8 * nbytes / (rate_mbit * 1e6)
        copy_s, s2_s = statistics.median(copies), statistics.median(computes)
        rows.append({"model": model, "batch": batch, "split": k, "stage1_cpu_s": s1_s, "bytes": nbytes,
                     "wire_s": wire_s, "h2d_copy_s": copy_s, "stage2_cuda_s": s2_s,
                     "pipeline_s": s1_s + wire_s + copy_s + s2_s, "all_cpu_s": whole_cpu})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batches", default="1,32", help="comma list of batch sizes")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="the link's rate for the wire column")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the CPU stage (default: torch's)")
    p.add_argument("--repetitions", type=int, default=10)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu benchmark: no CUDA device here (torch.cuda.is_available() is false); nothing measured")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{args.model} on {torch.cuda.get_device_name()} (stage 2) behind {torch.get_num_threads()} CPU threads "
          f"(stage 1); wire at {args.rate_mbit:g} Mbit/s; medians of {args.repetitions}; times in ms")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        got = measure(args.model, batch, args.rate_mbit, args.repetitions)
        rows += got
        print(f"\nbatch {batch}: the whole model on the CPU {got[0]['all_cpu_s'] * 1e3:.2f} ms")
        print(f"{'k':>3} {'stage1 cpu':>10} {'bytes':>10} {'wire':>8} {'h2d copy':>9} {'stage2 cuda':>11} "
              f"{'pipeline':>9} {'x cpu':>6}")
        for r in got:
            print(f"{r['split']:>3} {r['stage1_cpu_s'] * 1e3:>10.3f} {r['bytes']:>10} {r['wire_s'] * 1e3:>8.3f} "
                  f"{r['h2d_copy_s'] * 1e3:>9.3f} {r['stage2_cuda_s'] * 1e3:>11.3f} {r['pipeline_s'] * 1e3:>9.3f} "
                  f"{r['all_cpu_s'] / r['pipeline_s']:>6.2f}")
        best = min(got, key=lambda r: r["pipeline_s"])
        print(f"gpu: batch {batch}: best split k={best['split']}, {best['pipeline_s'] * 1e3:.2f} ms a batch, "
              f"{best['all_cpu_s'] / best['pipeline_s']:.2f}x the whole model on the CPU")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
