"""A split LM computes what the unsplit one does: at every cut of the tiny model (and a chain of
three), the greedy tokens equal transformers' own generation and the logits agree within 1e-5;
each stage holds only its blocks and the KV cache of its layers."""

from __future__ import annotations

import json

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm import build, generate, prompts, shapes

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111]
GEN = 10
LOGIT_TOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    src = build.source("tiny-lm")
    ref = generate.reference_model(src)
    return src, ref, generate.generate_unsplit(ref, PROMPT, GEN)


def test_the_default_weights_are_responsive(tiny):
    src, ref, (want, _) = tiny
    other, _ = generate.generate_unsplit(ref, [5, 6, 7, 8], GEN)
    assert other != want, "the generated tokens must depend on the prompt"
    assert len(set(want)) > 2, "an untrained model that repeats one token tests nothing"


@pytest.mark.parametrize("plan", [[k] for k in range(7)] + [[2, 4], [0, 3], [1, 5]])
def test_tokens_equal_the_unsplit_model_at_every_cut(tiny, plan):
    src, _, (want, want_logits) = tiny
    got, logits = generate.generate_split(generate.build_plan(src, plan), PROMPT, GEN)
    assert got == want
    assert max(float((a - b).abs().max()) for a, b in zip(logits, want_logits)) < LOGIT_TOL


def test_seeded_sampling_is_the_same_split_or_not(tiny):
    src, ref, _ = tiny
    sampling = generate.Sampling(temperature=0.8, top_k=20, seed=3)
    want, _ = generate.generate_unsplit(ref, PROMPT, GEN, sampling)
    got, _ = generate.generate_split(generate.build_plan(src, [3]), PROMPT, GEN, sampling)
    assert got == want and want != generate.generate_unsplit(ref, PROMPT, GEN)[0]


def test_kv_bytes_per_stage_follow_the_formula(tiny):
    src, _, _ = tiny
    shape = src.shape
    stages = generate.build_plan(src, [2, 4])
    generate.generate_split(stages, PROMPT, GEN)
    positions = len(PROMPT) + GEN - 1  # the last chosen token is never fed back
    for j, stage in enumerate(stages):
        layers = len(shapes.stage_layers(shape, [2, 4], j))
        assert stage.kv_bytes() == 2 * shape.num_key_value_heads * shape.kv_head_dim * 4 * layers * positions


def test_each_stage_holds_only_its_blocks(tiny):
    src, _, _ = tiny
    params = shapes.block_params(src.shape)
    for plan in ([0], [3], [6], [2, 4]):
        for j, stage in enumerate(generate.build_plan(src, plan)):
            first, end = shapes.stage_blocks(src.shape, plan, j)
            shared = params[-1] if first == 0 and end == len(params) else 0  # a tied head is the embedding
            assert stage.parts.param_bytes() == 4 * (sum(params[first:end]) - shared), (plan, j)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_lossy_cut_dtypes_stay_close_and_the_difference_is_measured(tiny, dtype):
    src, _, (want, want_logits) = tiny
    got, logits = generate.generate_split(generate.build_plan(src, [3]), PROMPT, GEN, cut_dtype=dtype)
    diff = max(float((a - b).abs().max()) for a, b in zip(logits, want_logits))
    assert 0 < diff < 0.1


def _save_folder(tmp_path, src, with_tokenizer: bool):
    model = generate.reference_model(src)
    folder = tmp_path / "my-lm"
    model.save_pretrained(folder)
    if with_tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        vocab = {chr(c): c - 32 for c in range(32, 127)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
        tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tok.save(str(folder / "tokenizer.json"))
    return folder


def test_a_model_folder_made_by_save_pretrained_splits_exactly(tiny, tmp_path):
    src, _, (want, _) = tiny
    folder = _save_folder(tmp_path, src, with_tokenizer=False)
    mine = build.source(None, str(folder))
    assert mine.shape.num_hidden_layers == 4 and mine.model_dir == folder
    assert isinstance(prompts.tokenizer_for(folder), prompts.ByteTokenizer)
    got, _ = generate.generate_split(generate.build_plan(mine, [2]), PROMPT, GEN)
    assert got == want


def test_a_folder_tokenizer_json_is_used(tiny, tmp_path):
    src, _, _ = tiny
    folder = _save_folder(tmp_path, src, with_tokenizer=True)
    tok = prompts.tokenizer_for(folder)
    assert isinstance(tok, prompts.FileTokenizer) and tok.encode("AB") == [33, 34]


def test_bad_model_folders_are_refused_in_one_line(tiny, tmp_path):
    src, _, _ = tiny
    with pytest.raises(UsageError, match="no config.json"):
        build.source(None, str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UsageError, match="no \\*.safetensors"):
        build.source(None, str(tmp_path))
    folder = _save_folder(tmp_path / "b", src, with_tokenizer=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "no-such-lm"}))
    with pytest.raises(UsageError, match="architecture 'no-such-lm' is not a decoder-only causal LM"):
        build.source(None, str(folder))
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(UsageError, match="does not have the layout of a decoder-only LM"):
        build.source(None, str(folder))


def test_a_prompt_longer_than_the_positions_is_refused():
    with pytest.raises(UsageError, match="the model has 512"):
        prompts.prompt_ids(None, 500, 260, 512, 16, prompts.ByteTokenizer(), 0, 0)
    assert prompts.seeded_prompt(8, 260, 1, 0) == prompts.seeded_prompt(8, 260, 1, 0) != prompts.seeded_prompt(8, 260, 1, 1)
