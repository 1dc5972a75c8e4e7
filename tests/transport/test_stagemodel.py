"""A stage process's model, of either workload, is one StageModel: the runtime asks both kinds the
same things (issue 68), and the model's name decides which it builds."""

from __future__ import annotations

from paretopipe.llm.builder import LMBuilder
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport.runconfig import Generation, RunConfig
from paretopipe.transport.stagemodel import StageModel, stage_builder


def test_both_kinds_of_model_are_stage_models_and_the_name_picks_the_kind():
    image, language = stage_builder("mobilenet_v2"), stage_builder("tiny-lm")
    assert isinstance(image, StageBuilder) and isinstance(language, LMBuilder)
    assert image.input_size == 224 and language.input_size is None
    for built, generation in ((image, None), (language, Generation(gen_tokens=4, prompt_len=8))):
        assert isinstance(built, StageModel), type(built).__name__
        cuts = built.cuts_for(2)
        cfg = RunConfig(model=built.name, cuts=cuts, split_index=2, generation=generation)
        assert cfg.workload.generates == (generation is not None)
        assert built.stage(cuts, 0) is not None and built.stage_memory(cfg, 0)["param_bytes"] > 0
