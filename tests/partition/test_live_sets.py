"""Cuts where several tensors cross: every one up to three live tensors reproduces the unsplit
model, carries exactly what is used later, and N-stage plans carry a tensor past stages."""

from __future__ import annotations

import pytest
import torch

from conftest import exhaustive_sample, traced
from paretopipe.errors import UsageError
from paretopipe.partition import activation, fxcuts, tables

TOL = 1e-5
#: Cuts per number of live tensors (the 1-tensor counts are the block-era cuts, unchanged).
EXPECTED_WIDTHS = {"resnet18": {1: 22, 2: 46}, "efficientnet_b0": {1: 78, 2: 125, 3: 45},
                   "vit_b_16": {1: 31, 2: 109}, "mobilenetv2": {1: 72, 2: 80}}
#: ResNet and EfficientNet pool adaptively before their classifiers: their cuts do not depend on the
#: image size, so they are checked on small images (12x less compute); ViT takes 224 px only, one image.
SIZE = {"resnet18": 64, "efficientnet_b0": 64}
BATCH = {"vit_b_16": 1}
#: How many cuts make test checks of the models whose every cut takes longest (the first and last among them).
SAMPLE = {"vit_b_16": 8, "efficientnet_b0": 16}


def _widths(part: fxcuts.Partitioner) -> dict[int, int]:
    counts: dict[int, int] = {}
    for c in part.fine_cuts:
        counts[c.width] = counts.get(c.width, 0) + 1
    return counts


@pytest.mark.parametrize("name", ["resnet18", pytest.param("efficientnet_b0", marks=pytest.mark.slow),
                                  pytest.param("vit_b_16", marks=pytest.mark.slow)])
def test_every_cut_of_up_to_three_live_tensors_is_exact(name):
    model, part, inputs, _ = traced(name, batch=BATCH.get(name, 2), size=SIZE.get(name))
    assert _widths(part) == EXPECTED_WIDTHS[name]
    with torch.no_grad():
        ref = model(inputs)
    # ViT's 140 cuts are 140 forward passes of ViT-B: make test checks a seeded sample of them, and of
    # EfficientNet-B0's (make test-exhaustive: all of both).
    cuts = part.candidate_cuts(3)
    for cut in exhaustive_sample(cuts, SAMPLE[name]) if name in SAMPLE else cuts:
        first, second = part.stages([cut.name])
        with torch.no_grad():
            mid = first(inputs)
            live = activation.live_tensors(mid)
            assert [tuple(t.shape) for t in live] == [t.shape for t in cut.live], cut.name
            assert sum(t.numel() * t.element_size() for t in live) == cut.nbytes
            out = activation.call_stage(second, mid)
        diff = float((out - ref).abs().max())
        assert diff <= TOL, f"{name} cut {cut.name}: max abs diff {diff}"


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_the_live_set_is_minimal_and_complete(name):
    # Minimal: every tensor that crosses is used after the cut. Complete: the later stage needs
    # nothing else from before it (a stage that did would fail to build).
    _, part, _, _ = traced(name, batch=1, size=64)
    position = {n.name: i for i, n in enumerate(part.nodes)}
    for cut in part.fine_cuts:
        _, second = part.stages([cut.name])
        placeholders = [n for n in second.graph.nodes if n.op == "placeholder"]
        assert [p.name for p in placeholders] == [t.name for t in cut.live]
        for p in placeholders:
            assert p.users, f"{name} cut {cut.name}: {p.name} crosses but is not used after it"
        for t in cut.live:
            assert position[t.name] <= cut.position  # produced before the cut
    assert any(c.width == 2 for c in part.fine_cuts)


def test_a_tensor_used_two_stages_later_is_carried_through_the_stage_between():
    model, part, inputs, _ = traced("resnet18", batch=2, size=64)
    # Inside layer1.0: the block's input (maxpool) waits for its branch while conv1 and conv2 run.
    wide = [c for c in part.fine_cuts if c.width == 2 and c.live[0].name == "maxpool"]
    assert len(wide) >= 2
    a, b = wide[0], wide[-1]
    stages = part.stages([a.name, b.name])
    middle_inputs = [n.name for n in stages[1].graph.nodes if n.op == "placeholder"]
    assert middle_inputs == ["maxpool", a.live[1].name]
    with torch.no_grad():
        carried = activation.call_stage(stages[1], stages[0](inputs))
        assert torch.equal(carried[0], stages[0](inputs)[0])  # maxpool passes through untouched
        diff = float((fxcuts.run_stages(stages, inputs) - model(inputs)).abs().max())
    assert diff <= TOL


def test_candidate_cuts_widen_with_max_live_and_the_table_shows_live_sets():
    _, part, _, _ = traced("resnet18", batch=1, size=64)
    assert part.candidate_cuts(1) == [c for c in part.fine_cuts if c.width == 1]
    assert len(part.candidate_cuts(2)) == len(part.fine_cuts) == 68
    with pytest.raises(UsageError, match="--max-live 0"):
        part.candidate_cuts(0)
    table = tables.format_table(part, fine=True).splitlines()
    assert table[0].split() == ["index", "cut", "live", "shapes", "bytes@1", "FLOPs", "%"]
    row = next(line for line in table if line.split()[1] == "maxpool+layer1_0_relu")
    assert row.split()[2] == "2" and "64x16x16 + 64x16x16" in row and "128.0 KiB" in row


def test_an_unknown_live_set_name_is_refused_in_one_line():
    _, part, _, _ = traced("resnet18", batch=1, size=64)
    with pytest.raises(UsageError, match="unknown cut 'maxpool\\+fc'; valid: 68 fx cuts") as err:
        part.stages(["maxpool+fc"])
    assert "\n" not in str(err.value)
