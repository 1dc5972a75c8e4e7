#!/usr/bin/env python3
"""The anchor's --enable-prefetch, measured: a data source's images per second with input batches
prepared ahead in a thread (depth 2 and 4) against none, on real photographs in an ImageFolder
(JPEG/PNG decoded, resized, cropped and normalised for every batch), each batch then run through
stage 1 of MobileNetV2 (the first 8 blocks) as a TCP stage 1 does.

Side by side in interleaved rounds; printed: each mode's median images/s over the rounds and its
ratio to no prefetching. Goal: > 1 where decoding and computing can overlap (two cores here);
on one core the thread can only take turns with the compute.

    python benchmarks/prefetch.py [--rounds 5] [--batches 12] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import inputs


def _image_folder(root: Path, copies: int) -> Path:
    """scikit-image's sample photographs (shipped in its wheel) as an ImageFolder of two classes."""
    photos = inputs._photo_files()
    for c in range(2):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(copies):
            for p in photos:
                shutil.copy(p, folder / f"{i}-{p.name}")
    return root


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    builder = StageBuilder("mobilenetv2")
    stage = builder.stage([builder.partitioner.block_cut(8)], 0)
    depths = (0, 2, 4)
    rates: dict[int, list[float]] = {d: [] for d in depths}
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"imagefolder:{_image_folder(Path(tmp), copies=4)}"
        for _ in range(args.rounds):
            for depth in depths:
                batches = inputs.source_batches(spec, args.batch_size, builder.input_size, args.batches,
                                                prefetch=depth)
                started = time.perf_counter()
                with torch.no_grad():
                    for x in batches:
                        stage(x)
                rates[depth].append(args.batches * args.batch_size / (time.perf_counter() - started))
                if isinstance(batches, inputs.Prefetcher):
                    batches.close()
    base = statistics.median(rates[0])
    print(f"images/s at batch {args.batch_size}, {args.batches} batches, median of {args.rounds} interleaved rounds:")
    for depth in depths:
        med = statistics.median(rates[depth])
        label = "no prefetch" if depth == 0 else f"--prefetch-batches {depth}"
        print(f"  {label:22s} {med:7.1f}  ratio to none {med / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
