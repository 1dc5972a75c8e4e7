"""A language model's default weights are the same bits on every CPU: the blocks transformers
lays out here, filled from the portable generator, have the fingerprints the shapes alone gave
on aarch64 (``make arm-fingerprints``: a Pi 4's Cortex-A72 under qemu-user, no transformers
there), which the golden file holds. This also checks transformers' layout of each architecture
against the names and shapes the project expects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paretopipe.llm import build, shapes
from paretopipe.partition import weightcache
from paretopipe.partition.models import fingerprint_tensors

GOLDEN = json.loads((Path(__file__).parent / "golden" / "fingerprints.json").read_text())


def test_the_golden_file_comes_from_a_pi_core_with_this_generator():
    assert GOLDEN["machine"] == "aarch64" and GOLDEN["qemu_cpu"] in ("cortex-a72", "cortex-a76")
    assert GOLDEN["generator"] == build.GENERATOR
    assert set(GOLDEN["fingerprints"]) == set(shapes.NAMED)


@pytest.mark.parametrize("name", sorted(shapes.NAMED))
def test_each_models_blocks_built_here_equal_aarch64(name, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")  # drawn here and now: a cached copy proves nothing
    src = build.source(name)
    for block in build.golden_blocks(src.shape):
        got = fingerprint_tensors(build.block_weights(src, block))
        assert got == GOLDEN["fingerprints"][name][block], f"{name} {block}"
