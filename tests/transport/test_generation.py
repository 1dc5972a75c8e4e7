"""A generation's parts of the runtime without a socket: stage 1's feed and every stage's checks
and compute, in process, give the unsplit model's tokens; what a peer sends is checked before it
is used; the record's generation part and figures come from the stages' parts."""

from __future__ import annotations

import pytest
import torch

from paretopipe.errors import PeerError, WireError
from paretopipe.llm import generate
from paretopipe.llm.builder import LMBuilder
from paretopipe.llm.summary import finish_record
from paretopipe.transport.generation import GenerationStage, PromptFeed
from paretopipe.transport.runconfig import Generation, RunConfig


@pytest.fixture(scope="module")
def builder():
    return LMBuilder("tiny-lm")


def _cfg(cuts, **generation) -> RunConfig:
    return RunConfig(model="tiny-lm", cuts=cuts, split_index=[int(c[2:]) for c in cuts],
                     generation=Generation(**{"gen_tokens": 5, "streams": 2, "prompt_len": 9, "warmup_streams": 1,
                                              **generation}))


def _run(builder, cfg) -> PromptFeed:
    """The feed's schedule through every stage in this process, each cut crossed as the wire does."""
    feed = PromptFeed(builder, cfg)
    stages = [feed.stage] + [GenerationStage(builder, cfg, i) for i in range(1, len(cfg.cuts) + 1)]
    for seq, step in enumerate(feed.steps):
        if step.feeds_on is not None:
            feed.wait_for(seq, lambda: None, 5)
        stream, start, x = feed.load(seq)
        for stage in stages[:-1]:
            h, _ = stage.forward(seq, stream, x if stage.index == 0 else stage.stage_input(seq, x, start), start)
            x = stage.encode(h)
        last = stages[-1]
        logits, _ = last.forward(seq, stream, last.stage_input(seq, x, start), start)
        feed.landed(seq, last.choose(logits, stream, step.step))
    return feed


@pytest.mark.parametrize("cuts", [["lm0"], ["lm3"], ["lm6"], ["lm1", "lm4"]])
def test_the_feed_and_the_stages_generate_the_unsplit_models_tokens(builder, cuts):
    cfg = _cfg(cuts)
    feed = _run(builder, cfg)
    part = feed.part()
    reference = generate.reference_model(builder.src)
    want = [generate.generate_unsplit(reference, p, 5)[0] for p in builder.prompts(cfg.generation, cfg.seed)]
    assert part["tokens"] == want and part["prompt_tokens"] == [9, 9]
    assert "sequences" not in part  # float32: no exactness check unless asked


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_quantised_wire_keeps_its_logits_and_checks_them_against_the_unsplit_model(builder, dtype):
    cfg = RunConfig(model="tiny-lm", cuts=["lm3"], split_index=3, wire_dtype=dtype,
                    generation=Generation(gen_tokens=4, streams=1, prompt_len=6, warmup_streams=0))
    assert cfg.generation.check_exact  # a lossy wire always measures what it costs
    feed = PromptFeed(builder, cfg)
    last = GenerationStage(builder, cfg, 1)
    for seq, step in enumerate(feed.steps):
        stream, start, ids = feed.load(seq)
        h, _ = feed.stage.forward(seq, stream, ids, start)
        sent = feed.stage.encode(h)
        if dtype == "int8":  # one float32 scale per 32 values of a token (tiny-lm's 64: two)
            assert sent[0].dtype == torch.int8 and sent[1].shape == (1, ids.shape[1], 2)
        else:  # two values a byte, one scale per 32 values, and the shape
            assert sent[0].dtype == torch.uint8 and sent[2].tolist() == [1, ids.shape[1], builder.shape.hidden_size]
        logits, _ = last.forward(seq, stream, last.stage_input(seq, sent, start), start)
        feed.landed(seq, last.choose(logits, stream, step.step))
    exact = last.part(feed.part()["sequences"])["exactness"]
    assert exact["steps"] == 4 and 0 <= exact["token_agreement"] <= 1 and 0 < exact["max_logit_diff"] < 0.5


@pytest.mark.parametrize("meta, why", [
    ({"stream": 9, "start": 0, "step": 0}, "a stream 0..2"),
    ({"stream": 0, "start": -1, "step": 0}, "a start position"),
    ({"stream": 0, "start": 0, "step": True}, "a start position"),
    (None, "must name a stream"),
])
def test_a_steps_place_is_checked(builder, meta, why):
    stage = GenerationStage(builder, _cfg(["lm3"]), 1)
    with pytest.raises(WireError, match=why):
        stage.step_of(4, meta)


def test_token_ids_across_split_0_are_checked_against_the_vocabulary(builder):
    stage = GenerationStage(builder, _cfg(["lm0"]), 1)
    assert stage.stage_input(0, torch.tensor([[1, 2]]), 0).tolist() == [[1, 2]]
    with pytest.raises(WireError, match="outside the vocabulary of 260"):
        stage.stage_input(0, torch.tensor([[1, 260]]), 0)
    with pytest.raises(WireError, match="int64"):
        stage.stage_input(0, torch.tensor([[1.0]]), 0)


def test_a_result_must_answer_its_step_and_a_missing_token_times_out(builder):
    feed = PromptFeed(builder, _cfg(["lm3"], warmup_streams=0))
    assert feed.token_of(0, {"stream": 0, "token": 7}) == 7
    for meta in ({"stream": 1, "token": 7}, {"stream": 0, "token": 260}, {"stream": 0}, "x"):
        with pytest.raises(WireError, match="must name its stream"):
            feed.token_of(0, meta)
    with pytest.raises(PeerError, match="no token for step 0"):
        feed.wait_for(2, lambda: None, 0.1)  # step 2 is stream 0's second: it waits for step 0


def test_the_records_generation_part_joins_the_stages_parts(builder):
    parts = [{"generation": {"prompt_tokens": [3], "tokens": [[5, 6]], "sequences": [[1, 2, 3, 5, 6]],
                             "blocks": [0, 3], "kv_bytes": 10}},
             {"generation": {"blocks": [3, 7], "kv_bytes": 20, "exactness": {"token_agreement": 1.0,
                                                                             "max_logit_diff": 0.0, "steps": 2}}}]
    batches = [{"seq": i, "warmup": False, "stream": 0, "step": i, "start_s": i, "end_s": i + 0.5, "latency_s": 0.5,
                "stage1_compute_s": 0.1, "stage2_compute_s": 0.2, "wire_bytes": 12 if i == 0 else 4} for i in (0, 1)]
    record = {"batches": batches, "manifest": {"link": {}}, "summary": {"energy_modelled_per_image_j": 2.0}}
    finish_record(record, parts)
    g = record["generation"]
    assert g["tokens"] == [[5, 6]] and g["prompt_tokens"] == [3] and g["exactness"]["steps"] == 2
    assert [s["kv_bytes"] for s in g["stages"]] == [10, 20] and "sequences" not in g["stages"][0]
    s = record["summary"]
    assert s["ttft_median_s"] == 0.5 and s["tpot_median_s"] == 1.0 and s["prefill_bytes"] == 12
    assert s["bytes_per_token"] == 4 and s["stage2_decode_compute_median_s"] == 0.2
    assert s["energy_modelled_per_token_j"] == 2.0 and "energy_modelled_per_image_j" not in s
