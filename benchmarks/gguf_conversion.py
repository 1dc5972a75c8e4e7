#!/usr/bin/env python3
"""The real SmolLM2-135M-Instruct's GGUF dequantised to a folder (``paretopipe.llm.checkpoints``),
with each GGUF parsed once per conversion and with transformers' three parses, side by side.

A machine converts the GGUF once and caches the folder, so this is what a fresh machine (CI) and a
user's first run of the real model pay. Rounds alternate the two so the machine's drift hits both;
both folders must hold the same bytes. Printed: the medians of each one's CPU and their ratio.

    python benchmarks/gguf_conversion.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"  # as sweeps run it: the tokenizer's saved settings say so
    import torch

    from paretopipe.llm import checkpoints

    torch.set_num_threads(1)
    gguf_file = checkpoints.real_file("smollm2-135m-instruct")
    digest, once = checkpoints.file_digest(gguf_file), checkpoints._gguf_parsed_once
    cpu: dict[str, list[float]] = {"three parses": [], "once": []}
    folders: dict[str, str] = {}
    for _ in range(args.rounds):
        for how in cpu:
            checkpoints._gguf_parsed_once = once if how == "once" else contextlib.nullcontext
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    start = time.process_time()
                    checkpoints._convert(gguf_file, digest, Path(tmp) / "out", "benchmark")
                    cpu[how].append(time.process_time() - start)
                    folders[how] = _digest(Path(tmp) / "out")
            finally:
                checkpoints._gguf_parsed_once = once
        assert folders["once"] == folders["three parses"], "the two conversions wrote different folders"
    before, after = (statistics.median(v) for v in cpu.values())
    print(f"conversion (same bytes): three parses {before:.1f} s CPU, once {after:.1f} s; {before / after:.2f}x "
          f"(median of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
