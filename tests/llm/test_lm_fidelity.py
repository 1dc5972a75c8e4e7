"""What a lossy cut costs a language model, teacher-forced (transport.fidelity.evaluate_generation):
a float32 cut is the unsplit model exactly (agreement 1, KL 0, the same perplexity), int8 and int4
measurably are not, more so int4; an evaluation text is read and tokenised as prompts are, and a
text too short or missing is one line."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm.builder import LMBuilder
from paretopipe.transport import fidelity
from paretopipe.transport.runconfig import Generation, RunConfig


def _cfg(builder: LMBuilder, dtype: str, **kw) -> RunConfig:
    return RunConfig(model=builder.name, cuts=builder.cuts_for(3), split_index=3, wire_dtype=dtype,
                     generation=Generation(gen_tokens=4, prompt_len=8), **kw)


@pytest.fixture(scope="module")
def tiny() -> LMBuilder:
    return LMBuilder("tiny-lm")


def test_a_float32_cut_is_the_unsplit_model_and_quantised_ones_cost_more_as_they_send_less(tiny):
    exact = fidelity.evaluate(tiny, _cfg(tiny, "float32", eval_samples=96))
    assert exact["fidelity_samples"] == 96 and exact["fidelity_top1_agreement"] == 1.0
    assert exact["fidelity_kl_mean"] == pytest.approx(0.0, abs=1e-9)
    assert exact["perplexity"] == pytest.approx(exact["perplexity_float32"], rel=1e-9)
    int8 = fidelity.evaluate(tiny, _cfg(tiny, "int8", eval_samples=96))
    int4 = fidelity.evaluate(tiny, _cfg(tiny, "int4", eval_samples=96))
    assert int8["perplexity_float32"] == exact["perplexity_float32"]  # the same reference and tokens
    assert 0 < int8["fidelity_kl_mean"] < int4["fidelity_kl_mean"]
    assert int4["fidelity_top1_agreement"] <= int8["fidelity_top1_agreement"] <= 1.0


def test_an_evaluation_text_is_tokenised_as_prompts_are_and_a_short_or_missing_one_is_one_line(tiny, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    cfg = _cfg(tiny, "int8", eval_samples=40, eval_text=str(text))
    assert fidelity.evaluation_tokens(tiny, cfg) == tiny.tokenizer.encode(text.read_text())[:41]
    got = fidelity.evaluate(tiny, cfg)
    assert got["fidelity_samples"] == 40 and got["perplexity"] > 0
    with pytest.raises(UsageError, match=r"--eval-text .*: 180 tokens; --eval-samples 500 needs 501"):
        fidelity.evaluation_tokens(tiny, _cfg(tiny, "int8", eval_samples=500, eval_text=str(text)))
    with pytest.raises(UsageError, match="--eval-text .*missing.txt: No such file"):
        fidelity.evaluation_tokens(tiny, _cfg(tiny, "int8", eval_samples=4, eval_text=str(tmp_path / "missing.txt")))
    with pytest.raises(UsageError, match="--eval-text is a language model's"):
        RunConfig(model="mobilenetv2", cuts=["c"], eval_text=str(text))


def _model_folder(tmp_path, tiny: LMBuilder):
    """tiny-lm's weights as a --model-dir folder (save_pretrained, as a user's checkpoint is)."""
    from paretopipe.llm import generate

    folder = tmp_path / "my-lm"
    generate.reference_model(tiny.src).save_pretrained(folder)
    return LMBuilder(None, model_dir=str(folder))


@pytest.mark.slow
def test_float32_perplexity_is_the_unsplit_models_at_every_cut_and_quantised_cuts_are_beside_it(tiny, tmp_path):
    """The issue's showing, for tiny-lm and a --model-dir folder: at every cut float32's perplexity
    equals the unsplit model's; int8's and int4's are measured beside it."""
    for builder in (tiny, _model_folder(tmp_path, tiny)):
        for k in range(builder.partitioner.num_blocks + 1):
            cfg = RunConfig(model=builder.name, cuts=builder.cuts_for(k), split_index=k, eval_samples=64,
                            generation=Generation(gen_tokens=4, prompt_len=8))
            exact = fidelity.evaluate(builder, cfg)
            assert exact["perplexity"] == pytest.approx(exact["perplexity_float32"], rel=1e-9), (builder.name, k)
            assert exact["fidelity_top1_agreement"] == 1.0
            for dtype in ("int8", "int4"):
                lossy = fidelity.evaluate(builder, cfg.replace(wire_dtype=dtype))
                assert lossy["perplexity_float32"] == exact["perplexity_float32"] and lossy["perplexity"] > 0


@pytest.mark.parametrize("target", [0.5, 1.0])
def test_auto_picks_a_language_models_cut_dtype_by_next_token_agreement_on_tokens_apart(tiny, tmp_path, target):
    text = tmp_path / "eval.txt"
    text.write_text("".join(chr(32 + (i * 37) % 90) for i in range(400)))
    cfg = _cfg(tiny, "auto", eval_samples=64, eval_text=str(text), fidelity_target=target)
    chose = fidelity.chosen(tiny, cfg)
    tried = chose.wire_choice["tried"]
    # The fewest bytes first; the pick is the first whose agreement reaches the target (float32 if none).
    assert list(tried) == ["int4", "int8", "float16", "bfloat16"][:len(tried)]
    kept = [d for d, v in tried.items() if v["kept"] >= target]
    assert chose.wire_dtype == (kept[0] if kept else "float32") and chose.wire_choice["measure"] == "top-1 agreement"
    assert all(tried[d]["kept"] < target for d in list(tried)[:-1])
    # Calibrated on the text's last tokens, the evaluation pass takes its first ones.
    ids = tiny.tokenizer.encode(text.read_text())
    assert fidelity.evaluation_tokens(tiny, cfg, fidelity.CALIBRATION_SEED) == ids[-65:]
    assert fidelity.evaluation_tokens(tiny, cfg) == ids[:65]
