#!/usr/bin/env python3
"""Multi-device planner: dynamic programming vs enumerating every cut combination, same front.

Profiles are synthetic but shaped like MobileNetV2's (74 boundaries, activation sizes falling
from megabytes to bytes); devices differ in speed. Prints, per chain, both wall times, their
ratio, and that the two fronts are identical.
"""

from __future__ import annotations

import random
import time

from paretopipe.predict.costmodel import LinkModel
from paretopipe.predict.device_profile import synthetic_profile
from paretopipe.predict.planner import brute_force_plans, pareto_plans


def main() -> None:
    rng = random.Random(0)
    segments = 73
    sizes = [int(1.6e6 * 0.93 ** i) for i in range(segments)] + [40]
    base = [rng.uniform(0.05, 0.6) * 1e-3 for _ in range(segments)]
    for n_dev, positions in ((3, 74), (4, 20), (4, 40), (5, 20)):
        speeds = [4.0, 1.0, 0.1, 0.5, 2.0][:n_dev]
        devices = [synthetic_profile([t * s for t in base], sizes, encode_s=2e-5, decode_s=2e-5, frame_overhead=56)
                   for s in speeds]
        links = [LinkModel.of(delay_s=0.005, rate_bps=r) for r in (50e6, 1e9, 100e6, 20e6)[:n_dev - 1]]
        pos = sorted(rng.sample(range(segments + 1), positions - 2) + [0, segments])
        t0 = time.perf_counter()
        dp = pareto_plans(devices, links, 1, pos)
        t_dp = time.perf_counter() - t0
        t0 = time.perf_counter()
        bf = brute_force_plans(devices, links, 1, pos)
        t_bf = time.perf_counter() - t0
        same = [(round(p.latency_s, 12), round(p.bottleneck_s, 12)) for p in dp] == \
               [(round(p.latency_s, 12), round(p.bottleneck_s, 12)) for p in bf]
        print(f"{n_dev} devices, {len(set(pos))} cut positions: DP {t_dp * 1e3:8.1f} ms, enumeration "
              f"{t_bf * 1e3:9.1f} ms, enumeration / DP = {t_bf / t_dp:6.1f}x; {len(dp)} plans, fronts identical: {same}")


if __name__ == "__main__":
    main()
