"""Every torchvision classification builder builds and lists its cuts, meta device or not (make
test a seeded twelve of the 80, make test-exhaustive every one: conftest ``exhaustive_sample``).

RegNet's builder computes with tensors while it is constructed, which the meta device cannot do
("Cannot copy out of meta tensor"): ``models.skeleton`` falls back to a real build for it. The
structure-only path (``split --list``, ``--dry-run``) is what runs here: exactness on responsive
weights is proven on the eight named models in test_fxcuts.py."""

from __future__ import annotations

import pytest
import torch
import torchvision.models as tvm

from conftest import exhaustive_sample
from paretopipe.errors import UsageError
from paretopipe.partition import models, tables

BUILDERS = tvm.list_models(module=tvm)


def test_regnet_falls_back_to_a_real_build_and_lists_its_cuts():
    with pytest.raises((NotImplementedError, RuntimeError)):  # why it needs the fallback
        with torch.device("meta"):
            models.construct("regnet_y_400mf", 10)
    model = models.skeleton("regnet_y_400mf", 10)
    assert all(p.is_meta for p in model.parameters())  # built for real, then nothing held
    _, part = tables.partitioner_for("regnet_y_400mf", structure_only=True)
    assert part.num_blocks >= 5 and len(part.cuts) > part.num_blocks
    table = tables.format_table(part)
    assert table.splitlines()[0].split()[:3] == ["k", "block", "cut"] and "(whole model)" in table


@pytest.mark.slow
@pytest.mark.parametrize("name", exhaustive_sample(BUILDERS, k=12))
def test_every_classification_builder_lists_its_cuts_or_is_refused_in_one_line(name):
    try:
        model, part = tables.partitioner_for(name, structure_only=True)
    except UsageError as exc:  # allowed, but it must say why in one line
        assert str(exc) and "\n" not in str(exc)
        return
    assert part.num_blocks >= 1 and len(part.cuts) >= 1
    # Every block cut is one of the fine cuts, and the endpoints are the two baselines.
    cuts = part.block_cuts()
    assert len(cuts) == part.num_blocks + 1 and cuts[0] == "input" and cuts[-1] == "output"
    assert set(cuts[1:-1]) <= {c.name for c in part.cuts}
