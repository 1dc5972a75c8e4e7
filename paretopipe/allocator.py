"""Keep freed activations in the process heap, so that a stage and its profile compute alike.

A CNN's early activations are megabytes (MobileNetV2's first blocks: 1.6 to 4.8 MB per image).
glibc's malloc gives such a block its own ``mmap`` and returns it to the kernel on ``free``, so
every batch page-faults its activations in afresh; and where the heap serves them, it trims its top
back to the kernel after each batch. Which of the two a process gets depends on its history:
glibc raises its mmap threshold the first time a large block is freed, so a process that happened
to load photos first (a profile) ran MobileNetV2's first four blocks in 8 ms on the development VM
while a stage process that never did ran them in 18 ms, and the cost model's predictions were
1.4 to 2 times too fast (``benchmarks/stage_vs_profile.py``).

Every process that computes a stage calls :func:`keep_activations_in_heap` before its first batch:
large blocks stay in the heap and the heap is not trimmed, so the pages of one batch serve the
next, whatever the process did before. The cost is that the heap keeps its peak (a stage's peak
resident memory, which the record already reports). On a C library without ``mallopt`` (musl,
macOS) nothing changes and :func:`settings` says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

#: mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2): blocks above it are always mapped.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Free memory at the heap's top above this goes back to the kernel; below, it is kept for the next batch.
TRIM_THRESHOLD_BYTES = 1 << 30

_applied: dict[str, Any] | None = None


def keep_activations_in_heap() -> dict[str, Any]:
    """Set both thresholds once for this process (both are needed: either alone leaves the other
    path faulting every batch); returns :func:`settings`."""
    global _applied
    if _applied is not None:
        return _applied
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        _applied = {"allocator": "unchanged", "why": "this C library has no mallopt (not glibc)"}
        return _applied
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                  TRIM_THRESHOLD_BYTES))
    _applied = ({"allocator": "glibc, activations kept in the heap", "mmap_threshold_bytes": MMAP_THRESHOLD_BYTES,
                 "trim_threshold_bytes": TRIM_THRESHOLD_BYTES} if ok else
                {"allocator": "unchanged", "why": "mallopt refused the thresholds"})
    return _applied


def settings() -> dict[str, Any]:
    """What this process's allocator runs with, for node manifests."""
    return _applied or {"allocator": "default"}
