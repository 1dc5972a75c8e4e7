"""A language model's stages behind the face every stage process holds (an image model's
StageBuilder's): its cuts by name, what crosses each, one plan's stage at a time, and the
options an image model's fine cuts would need refused in one line."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm import shapes
from paretopipe.llm.builder import LMBuilder
from paretopipe.llm.shapes import cut_name, split_of
from paretopipe.transport.stagemodel import stage_builder


def test_its_cuts_are_named_by_split_and_carry_the_shapes_bytes():
    b = LMBuilder("tiny-lm")
    part = b.partitioner
    assert part.num_blocks == 6 and part.block_cuts() == [f"lm{k}" for k in range(7)] and part.fine_cuts == ()
    assert [part.payload_nbytes(c, 1) for c in part.block_cuts()] == [8] + [256] * 6
    assert part.payload_nbytes("lm3", 12) == 12 * 256
    assert split_of(cut_name(5)) == 5 and b.cuts_for(3) == ["lm3"] and b.plan(["lm1", "lm4"]) == [1, 4]
    assert b.num_classes == shapes.named("tiny-lm").vocab_size  # the handshake's head: the vocabulary


def test_a_process_keeps_one_plans_stage_and_builds_only_its_blocks():
    b = LMBuilder("tiny-lm")
    first = b.stage(["lm3"], 1)
    assert b.stage(["lm3"], 1) is first  # kept across runs of one plan
    assert first.parts.embed is None and first.parts.lm_head is not None and len(first.parts.decoder) == 2
    other = b.stage(["lm1", "lm4"], 1)
    assert other is not first and len(other.parts.decoder) == 3 and b.stage(["lm3"], 1) is not first


@pytest.mark.parametrize("call, needle", [
    (lambda b: b.cuts_for(cut="features_3"), "a language model is split between its blocks"),
    (lambda b: b.cuts_for(9), "out of range for tiny-lm"),
    (lambda b: b.plan(["lm4", "lm2"]), "must increase"),
    (lambda b: split_of("features_3"), "not a language model's"),
])
def test_what_it_cannot_split_is_one_line(call, needle):
    with pytest.raises(UsageError, match=needle):
        call(LMBuilder("tiny-lm"))


def test_the_model_decides_which_builder_a_stage_process_holds():
    assert isinstance(stage_builder("tiny-lm"), LMBuilder)
    assert type(stage_builder("mobilenetv2", num_classes=10)).__name__ == "StageBuilder"
