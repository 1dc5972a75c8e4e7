#!/usr/bin/env python3
"""Print the default-weights fingerprints of the language models' golden blocks, as JSON.

Computed from the shapes alone (paretopipe.llm.build.expected_block_weights: no transformers,
which the aarch64 sysroot does not have); tests/llm/golden/fingerprints.json holds what this
printed on aarch64 under qemu-user (``make arm-fingerprints``), and tests/llm/test_lm_fingerprints.py
builds the same blocks through transformers on whatever CPU runs it and compares.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time


def main() -> int:
    import torch

    from paretopipe.llm.build import GENERATOR, expected_block_weights, fingerprint_tensors, golden_blocks
    from paretopipe.llm.shapes import NAMED

    out = {"machine": platform.machine(), "torch": torch.__version__, "generator": GENERATOR,
           "qemu_cpu": os.environ.get("QEMU_CPU"), "fingerprints": {}, "seconds": {}}
    for name, shape in NAMED.items():
        started = time.monotonic()
        out["fingerprints"][name] = {b: fingerprint_tensors(expected_block_weights(shape, b)) for b in golden_blocks(shape)}
        out["seconds"][name] = round(time.monotonic() - started, 1)
        print(f"{name} ({out['seconds'][name]} s)", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
