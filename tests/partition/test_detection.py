"""Detectors split exactly: the transform on the first stage, cuts in the backbone and the feature
pyramid (whose several outputs cross together), the heads and NMS on the last stage."""

from __future__ import annotations

import pytest
import torch

from conftest import exhaustive_sample
from paretopipe.partition import detection, fxcuts, models

TOL = 1e-5
DETECTORS = ["ssdlite320_mobilenet_v3_large", "yolox_n",
             pytest.param("fasterrcnn_mobilenet_v3_large_fpn", marks=pytest.mark.slow)]
#: (single-tensor cuts, every cut, block splits): the block cuts of a detector may carry several tensors.
EXPECTED = {"ssdlite320_mobilenet_v3_large": (48, 216, 21), "yolox_n": (24, 260, 12),
            "fasterrcnn_mobilenet_v3_large_fpn": (54, 187, 17)}


#: Faster R-CNN resizes every image to 800 px (1.6 to 3 s a forward here): make test checks three of
#: its 18 block splits (the two baselines and a seeded one), make test-exhaustive every one.
SAMPLE = {"fasterrcnn_mobilenet_v3_large_fpn": 3}


def _inputs(name: str, seed: int) -> torch.Tensor:
    size = models.input_size(name)
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", DETECTORS)
def test_the_block_splits_and_the_widest_cuts_give_the_unsplit_detections(name):
    model = models.build(name)
    x, other = _inputs(name, 1), _inputs(name, 2)
    part = fxcuts.Partitioner(model, x, name)
    assert (len(part.cuts), len(part.fine_cuts), len(part.blocks)) == EXPECTED[name]
    with torch.no_grad():
        ref, ref_other = model(x), model(other)
    # The comparison means something: the deterministic weights detect, and what they detect
    # depends on the image.
    assert int(ref[3][0]) > 10 and detection.same_detections(ref, ref_other) > 1000 * TOL
    widest = sorted(part.fine_cuts, key=lambda c: (-c.width, c.position))[:3]
    ks = range(part.num_blocks + 1)
    for cut in [part.block_cut(k) for k in exhaustive_sample(ks, SAMPLE.get(name, len(ks)))] + [c.name for c in widest]:
        stages = part.stages([cut])
        with torch.no_grad():
            got = fxcuts.run_stages(stages, x)
        diff = detection.same_detections(got, ref)
        assert diff <= TOL, f"{name} cut {cut}: {diff}"
    # The pyramid crosses a late cut whole: several tensors, each used after it.
    assert max(c.width for c in part.fine_cuts) >= 3


def test_a_detectors_first_stage_runs_its_transform_and_its_last_the_heads():
    name = "ssdlite320_mobilenet_v3_large"
    model = models.build(name)
    part = fxcuts.Partitioner(model, _inputs(name, 1), name)
    first, last = part.stages([part.block_cut(3)])
    assert isinstance(first, detection.FirstStage) and first.pre is model.pre
    assert isinstance(last, detection.LastStage) and last.post is model.post
    # The input baseline still transforms on stage 1: what crosses is the resized, normalised image.
    assert part.payload_nbytes(fxcuts.INPUT, 1) == 3 * 320 * 320 * 4
    # The output baseline sends every pyramid level.
    assert part.payload_nbytes(fxcuts.OUTPUT, 1) == sum(
        t.numel() * 4 for t in model.body(model.pre(_inputs(name, 1))))


def test_detections_pack_into_fixed_shapes_with_counts():
    found = [{"boxes": torch.tensor([[1.0, 2, 3, 4]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([3])},
             {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}]
    boxes, scores, labels, counts = detection.pack(found, limit=4)
    assert boxes.shape == (2, 4, 4) and scores.shape == (2, 4) and labels.shape == (2, 4)
    assert counts.tolist() == [1, 0] and labels[0].tolist() == [3, -1, -1, -1]
    assert detection.same_detections((boxes, scores, labels, counts), (boxes, scores, labels, counts)) == 0
    other = (boxes, scores, labels.clone().fill_(-1), counts)
    assert detection.same_detections(other, (boxes, scores, labels, counts)) == float("inf")
