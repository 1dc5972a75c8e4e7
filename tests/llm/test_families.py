"""A model of either kind answers the same questions through its family (issue 68): the name picks
the family once, and each answer is the one its own kind's code gives."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm.families import FAMILIES, family_of, model_structure
from paretopipe.llm.shapes import cut_table, named, workload_of
from paretopipe.partition.structure import structure
from paretopipe.workload import BY_NAME


def test_every_workload_has_one_family_and_the_name_picks_it():
    assert set(FAMILIES) == set(BY_NAME)
    for model in ("mobilenetv2", "resnet18", "tiny-lm", "smollm2-135m"):
        family = family_of(model)
        assert family.workload is workload_of(model) and FAMILIES[family.workload.name] is family


def test_a_language_model_is_cut_between_blocks_and_named_by_its_shape():
    shape = named("tiny-lm")
    assert model_structure("tiny-lm", 1000) == {"model": shape.name, "num_blocks": shape.last_split, "fine_cuts": {}}
    assert family_of("tiny-lm").record_name("tiny-lm", None) == shape.name
    family_of("tiny-lm").check_name("tiny-lm")  # its name is its shape's: nothing to refuse


def test_an_image_models_structure_is_the_zoos_and_an_unknown_name_is_refused_in_one_line():
    assert model_structure("mobilenetv2", 1000) == structure("mobilenetv2", 1000)
    family = family_of("mobilenet_v2")
    assert family.record_name("mobilenet_v2", None) == structure("mobilenetv2", 1000)["model"]
    with pytest.raises(UsageError) as err:
        family_of("no-such-net").check_name("no-such-net")
    assert "no-such-net" in str(err.value) and "\n" not in str(err.value)


def test_the_cut_digest_follows_the_cuts_a_host_would_split_at():
    lm = family_of("tiny-lm")
    digest = lm.cut_digest("tiny-lm", 1000, None)
    assert digest == lm.cut_digest("tiny-lm", 1000, None) and len(digest) == 16
    assert digest != family_of("smollm2-135m").cut_digest("smollm2-135m", 1000, None)
    assert cut_table(named("tiny-lm")) != cut_table(named("smollm2-135m"))
    image = family_of("mobilenetv2")
    assert image.cut_digest("mobilenetv2", 1000, None) != image.cut_digest("resnet18", 1000, None)
