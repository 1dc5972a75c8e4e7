"""The named shapes are the real models' (their published parameter counts), and the cut table's
bytes per token are what crosses: hidden size x dtype bytes (ids at split 0)."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm import shapes

# Parameter counts the model cards and transformers' num_parameters() give for the real checkpoints.
PUBLISHED_PARAMS = {"smollm2-135m": 134_515_008, "smollm2-360m": 361_821_120, "qwen2.5-0.5b": 494_032_768,
                    "llama-3.2-1b": 1_235_814_400, "tinyllama-1.1b": 1_100_048_384}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_named_shapes_have_the_real_models_parameter_counts(name):
    shape = shapes.named(name)
    blocks = shapes.block_params(shape)
    total = sum(blocks) - (blocks[-1] if shape.tie_word_embeddings else 0)
    assert total == PUBLISHED_PARAMS[name]


# Bytes a token: 576 values, and the scales: one float32 per 32 values for int8 (a trained model's outlier channels) and int4.
@pytest.mark.parametrize("dtype,nbytes", [("float32", 2304), ("float16", 1152), ("bfloat16", 1152),
                                          ("int8", 576 + 4 * 18), ("int4", 288 + 4 * 18)])
def test_bytes_per_token_is_hidden_size_times_dtype_bytes_at_every_cut(dtype, nbytes):
    shape = shapes.named("smollm2-135m")
    cuts = shapes.cuts(shape, dtype)
    assert [c.split for c in cuts] == list(range(shape.num_hidden_layers + 3))
    assert cuts[0].bytes_per_token == 8 and cuts[0].crosses == "token ids"
    for cut in cuts[1:]:
        assert cut.bytes_per_token == nbytes
    assert cuts[-1].after == "norm" and cuts[1].after == "embed" and cuts[2].after == "layer0"


def test_a_split_out_of_range_or_a_chain_out_of_order_is_refused_naming_the_range():
    shape = shapes.named("tiny-lm")
    with pytest.raises(UsageError, match=r"0\.\.6"):
        shapes.check_split(shape, 7)
    with pytest.raises(UsageError, match="must increase"):
        shapes.check_plan(shape, [3, 2])
    with pytest.raises(UsageError, match="smollm2-135m"):
        shapes.named("gpt-7")


def test_stage_layers_partition_the_layers_between_the_stages():
    shape = shapes.named("tiny-lm")
    for plan in ([0], [1], [3], [6], [2, 4], [0, 6], [1, 2, 3]):
        held = [i for j in range(len(plan) + 1) for i in shapes.stage_layers(shape, plan, j)]
        assert held == list(range(shape.num_hidden_layers)), plan


def test_the_cut_table_lists_every_cut_with_stage_one_kv_per_token():
    table = shapes.cut_table(shapes.named("tiny-lm")).splitlines()
    assert len(table) == 2 + 7 + 1
    # split 3: stage 1 holds layers 0 and 1: 2 x 2 KV heads x 16 dims x 4 bytes x 2 layers
    assert table[2 + 3].split()[:4] == ["3", "layer1", "hidden", "state"] and table[2 + 3].split()[-1] == "512"
