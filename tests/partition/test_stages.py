"""A stage computes with the process's torch thread count on whichever thread runs it.

OpenMP's and MKL's thread counts belong to each thread, and torch applies its own to a thread only
at the thread's first parallel operator. A stage of GEMMs alone (flatten and a linear layer, the
last cut of most CNNs) on a fresh thread ran MKL on the defaults instead: two OpenMP threads in a
stage pinned to one core, 8 ms for a 5 us layer (measured, 2026-11-27). The counts are read here
from the very libraries torch loaded."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch
from torch import nn

from paretopipe.partition.stages import StageTimer


def _library(part: str) -> ctypes.CDLL:
    paths = sorted({line.split()[-1] for line in open("/proc/self/maps") if part in line and line.split()[-1][0] == "/"})
    if not paths:
        pytest.skip(f"torch loaded no {part} here (a build without OpenMP or MKL has no per-thread count)")
    return ctypes.CDLL(paths[0])


def _counts_in_a_new_thread(before_running: bool) -> tuple[int, int]:
    """OpenMP's and MKL's thread counts on a fresh thread, before or after it ran a stage of GEMMs."""
    gomp, torch_cpu = _library("libgomp"), _library("libtorch_cpu")
    mkl = getattr(torch_cpu, "mkl_get_max_threads", None)
    if mkl is None:
        pytest.skip("this torch has no MKL")
    stage = nn.Sequential(nn.Flatten(), nn.Linear(256, 10)).eval()
    seen: list[tuple[int, int]] = []

    def run() -> None:
        if not before_running:
            StageTimer("cpu").run(stage, torch.randn(8, 256, 1, 1), "cpu")
        seen.append((gomp.omp_get_max_threads(), mkl()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_a_stage_on_a_new_thread_runs_with_the_process_torch_threads():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a fresh thread's default is the process's count, nothing to tell apart")
    wanted = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # The hazard is real here: a fresh thread starts with the defaults, not 1.
        assert _counts_in_a_new_thread(before_running=True) != (1, 1)
        assert _counts_in_a_new_thread(before_running=False) == (1, 1)
    finally:
        torch.set_num_threads(wanted)
