"""A stage computes with the process's torch thread count on whichever thread runs it.

OpenMP's and MKL's thread counts belong to each thread, and torch applies its own to a thread only
at the thread's first parallel operator. A stage of GEMMs alone (flatten and a linear layer, the
last cut of most CNNs) on a fresh thread ran MKL on the defaults instead: two OpenMP threads in a
stage pinned to one core, 8 ms for a 5 us layer (measured, 2026-11-27). The counts are read, in a
fresh interpreter (what other tests did to this one's threads cannot matter), from the very
libraries torch loaded."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import PYTHON

PROBE = r"""
import ctypes, json, sys, threading
import torch
from torch import nn
from paretopipe.partition.stages import StageTimer

def library(part):
    paths = sorted({l.split()[-1] for l in open("/proc/self/maps") if part in l and l.split()[-1][0] == "/"})
    return ctypes.CDLL(paths[0]) if paths else None

gomp, torch_cpu = library("libgomp"), library("libtorch_cpu")
mkl = getattr(torch_cpu, "mkl_get_max_threads", None) if torch_cpu else None
if gomp is None or mkl is None:
    print(json.dumps({"skip": "torch loaded no libgomp or no MKL here: no per-thread count to check"}))
    sys.exit()
torch.set_num_threads(1)
stage = nn.Sequential(nn.Flatten(), nn.Linear(256, 10)).eval()
seen = {}

def fresh(run_stage):
    if run_stage:
        StageTimer("cpu").run(stage, torch.randn(8, 256, 1, 1), "cpu")
    seen[run_stage] = [gomp.omp_get_max_threads(), mkl()]

for run_stage in (False, True):
    t = threading.Thread(target=fresh, args=(run_stage,))
    t.start()
    t.join()
print(json.dumps({"before": seen[False], "after": seen[True]}))
"""


def test_a_stage_on_a_new_thread_runs_with_the_process_torch_threads():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a fresh thread's default is the process's count, nothing to tell apart")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["before"] != [1, 1]  # the hazard is real here: a fresh thread starts with the defaults
    assert got["after"] == [1, 1]   # a stage run on it has the process's count
