#!/usr/bin/env python3
"""A split language model's time per token against its physical bound, at every cut.

Per decode step at a cut, nothing can beat: stage 1's compute + the last stage's compute + one
round trip + the bytes per token over the link's rate. This runs the project's own sweep (each
stage a worker process pinned to a CPU of its own, one torch thread each, as an image model's
stages are) under a jitter-free emulated link (10 ms each way, 10 Mbit/s), then prints, at each
cut, the measured median time per token over that bound (the stage times are the medians the run
measured itself). What is above 1 is the runtime's own cost per token: framing, the send thread,
the emulated link's scheduling, Python.

    python benchmarks/llm_bound.py                      # tiny-lm, all cuts (about half a minute)
    python benchmarks/llm_bound.py --model smollm2-135m --splits 0,1,8,16,24,31,32 --prompt-len 64
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-lm")
    p.add_argument("--splits", default="all")
    p.add_argument("--prompt-len", default="32")
    args = p.parse_args()
    model, splits, prompt = args.model, args.splits, args.prompt_len
    with tempfile.TemporaryDirectory() as tmp:
        nets = Path(tmp) / "nets.toml"
        nets.write_text('[bench-10ms-10mbit]\ndelay = "10ms"\nrate = "10mbit"\n')
        subprocess.run([sys.executable, str(ROOT / "automated_split_tester.py"), "--model", model, "--splits", splits,
                        "--network", "bench-10ms-10mbit", "--network-file", str(nets), "--prompt-len", prompt,
                        "--gen-tokens", "24", "--threads", "1", "--out", tmp, "--session", "s", "--quiet", "--no-report"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(Path(tmp) / "s" / "summary.csv") as fh:
            rows = list(csv.DictReader(fh))
    print(f"{model}, prompt {prompt} tokens, 24 tokens, emulated 10 ms each way at 10 Mbit/s")
    print(f"{'split':>5} {'s1 ms':>7} {'s2 ms':>7} {'B/token':>8} {'bound ms':>9} {'TPOT ms':>8} {'TPOT/bound':>10}")
    ratios = []
    for r in rows:
        ratio = float(r["tpot_over_bound"])
        ratios.append(ratio)
        print(f"{r['split_index']:>5} {float(r['stage1_decode_compute_median_s']) * 1e3:>7.2f} "
              f"{float(r['stage2_decode_compute_median_s']) * 1e3:>7.2f} {float(r['bytes_per_token']):>8.0f} "
              f"{float(r['tpot_bound_s']) * 1e3:>9.2f} {float(r['tpot_median_s']) * 1e3:>8.2f} {ratio:>10.3f}")
    print(f"llm_bound: median time per token / bound {statistics.median(ratios):.3f} over {len(ratios)} cuts "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
