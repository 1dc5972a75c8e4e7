#!/usr/bin/env python3
"""Pipelining efficiency: measured throughput vs the bound 1 / max(stage 1, link, stage 2).

Two real processes (partition1.py, partition2.py), one core and one torch thread each, with
--in-flight 4. Case A: the link dominates (emulated 20 Mbit/s: serialisation time = wire bytes x
8 / rate). Case B: stage-1 compute dominates (late split, no shaping). The stage times are the
medians the run measured itself; efficiency = measured batches/s x max(term). Goal >= 0.9.
"""

from __future__ import annotations

from stages import tcp_run


def run(split: int, profile_args: list[str], rate_bps: float | None, batches: int = 24) -> dict:
    s = tcp_run(split, ["--in-flight", "4", *profile_args], batches, warmup=4, batch_size=2)
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
