"""Shared fixtures: models are built and traced once per session (the slow part of the suite)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

torch.set_num_threads(min(2, os.cpu_count() or 1))


@functools.lru_cache(maxsize=None)
def traced(name: str, batch: int = 2):
    """(model, partitioner, inputs, other_inputs) for a zoo model at ``batch`` images."""
    from paretopipe import models, split

    model = models.build(name)
    size = models.input_size(name)
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(batch, 3, size, size, generator=gen)
    other = torch.randn(batch, 3, size, size, generator=gen)
    part = split.Partitioner(model, inputs, models.canonical_name(name))
    return model, part, inputs, other


@pytest.fixture
def root() -> Path:
    return ROOT


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(autouse=True)
def _no_orphans():
    """Whatever a test started is killed afterwards, pass or fail: no orphan ever eats the CPU."""
    yield
    import signal

    from tcp_helpers import STARTED

    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
