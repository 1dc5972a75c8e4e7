#!/usr/bin/env python3
"""Print the default-weights fingerprint of every zoo model on this machine, as JSON.

The golden file tests/partition/golden/fingerprints.json holds what this printed on aarch64
(a Raspberry Pi's Cortex-A72, under qemu-user: ``make arm-fingerprints``); the test suite computes
the same on whatever CPU runs it and compares, so a change of architecture, torch build or thread
count that moved a single bit of the default weights fails CI.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

os.environ.setdefault("PARETOPIPE_CACHE_DIR", "none")  # build afresh: the cache is what is checked


def main() -> int:
    import torch

    from paretopipe.partition import models
    from paretopipe.partition.weightcache import INIT_VERSION

    names = sys.argv[1:] or list(models.NAMED_MODELS)
    out = {"machine": platform.machine(), "torch": torch.__version__, "init_version": INIT_VERSION,
           "qemu_cpu": os.environ.get("QEMU_CPU"), "fingerprints": {}, "build_s": {}}
    for name in names:
        started = time.monotonic()
        out["fingerprints"][name] = models.fingerprint(models.build(name))
        out["build_s"][name] = round(time.monotonic() - started, 1)
        print(f"{name} {out['fingerprints'][name]} ({out['build_s'][name]} s)", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
