#!/usr/bin/env python3
"""The portable weight draws (``paretopipe.partition.models.portable_stream``) in chunks that stay
in cache, against the same arithmetic on whole arrays (how every parameter was drawn before),
side by side: one VGG16-sized layer, then whole builds with the weight cache off.

Both give the same bits (checked here, and by tests/partition/test_fingerprints.py against a Pi's
golden file); only the passes over memory differ. A fresh machine builds every zoo model's weights
once (CI does, and so does a user's first sweep). Rounds alternate the two so the machine's drift
hits both; printed: the medians of each one's CPU and the whole / chunked ratio.

    python benchmarks/portable_draws.py [--rounds 3] [--models vgg16,mobilenetv2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time


def whole_array_uniform(shape, *key, scale: float = 1.0, dtype=None):
    """The previous draw: the whole parameter's raw stream at once, then torch's float64 product."""
    import numpy as np
    import torch

    from paretopipe.partition.models import portable_seed

    raw = np.random.PCG64(portable_seed(*key)).random_raw(math.prod(shape))
    values = torch.from_numpy(((raw >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0).reshape(tuple(shape)))
    return (values * scale).to(dtype or torch.float64)


def _cpu(fn) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="vgg16,mobilenetv2")
    args = p.parse_args()
    os.environ["PARETOPIPE_CACHE_DIR"] = "none"  # every build draws
    import torch

    from paretopipe.partition import models

    torch.set_num_threads(1)
    shape, scale = (4096, 25088), math.sqrt(3.0) * math.sqrt(2.0 / 25088)  # VGG16's classifier.0
    draws = {"whole": whole_array_uniform, "chunked": models.portable_uniform}
    layer: dict[str, list[float]] = {k: [] for k in draws}
    builds: dict[tuple[str, str], list[float]] = {}
    chunked = models.portable_uniform
    for _ in range(args.rounds):
        outs = {}
        for name, draw in draws.items():
            seconds, outs[name] = _cpu(lambda: draw(shape, 1, "classifier.0.weight", scale=scale, dtype=torch.float32))
            layer[name].append(seconds)
        assert torch.equal(outs["whole"], outs["chunked"]), "the two draws differ"
        for model in args.models.split(","):
            prints = {}
            for name, draw in draws.items():
                models.portable_uniform = draw  # what _portable_init calls
                try:
                    seconds, built = _cpu(lambda: models.build(model))
                finally:
                    models.portable_uniform = chunked
                builds.setdefault((model, name), []).append(seconds)
                prints[name] = models.fingerprint(built)
            assert prints["whole"] == prints["chunked"], f"{model}: the two builds differ"
    print(f"one {shape[0]} x {shape[1]} layer (same bits): whole {statistics.median(layer['whole']):.2f} s CPU, "
          f"chunked {statistics.median(layer['chunked']):.2f} s; "
          f"{statistics.median(layer['whole']) / statistics.median(layer['chunked']):.1f}x")
    for model in args.models.split(","):
        w, c = (statistics.median(builds[(model, k)]) for k in draws)
        print(f"{model} built with the cache off (same fingerprint): whole {w:.2f} s CPU, chunked {c:.2f} s; "
              f"{w / c:.2f}x (median of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
