"""int8 and int4 on the wire, for every model: each value within half a step of what was sent, the
bytes the sizing says (a third, then a sixth of float32's), the hidden state's int8 bit-equal to
what it was before images had it, and every malformed part refused in one line before anything is
allocated from it."""

from __future__ import annotations

import pytest
import torch

from paretopipe.errors import WireError
from paretopipe.partition import wirequant
from paretopipe.partition.activation import activation_nbytes
from paretopipe.wiredtype import INT4_GROUP, row_nbytes

SHAPES = [(2, 16, 8, 8), (2, 16, 4, 4), (3, 7, 5, 1, 2), (1, 5, 576), (4, 37), (9,)]


def _x(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.linspace(0.1, 10, shape[-1])


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_each_value_comes_back_within_half_a_step_of_its_own_scale(shape, dtype):
    x = _x(shape)
    parts = wirequant.quantise(x, dtype)
    assert tuple(p.dtype for p in parts) == wirequant.PART_DTYPES[dtype]
    back = wirequant.dequantise(parts, dtype)
    assert back.shape == x.shape and back.dtype == torch.float32
    # The step of a value is its row's (int8) or group's (int4) largest magnitude over 127 or 7.
    scale = parts[1]
    if dtype == "int8" and x.dim() == 3:  # a hidden state: a scale per group of a token's values
        step = scale.repeat_interleave(INT4_GROUP, dim=-1)
    elif dtype == "int8":
        step = scale.expand_as(x)
    else:
        rows = scale.shape[0]
        step = scale.repeat_interleave(INT4_GROUP, dim=1)[:, :x.numel() // rows].reshape(x.shape)
    assert bool(((back - x).abs() <= step / 2 + 1e-6).all())
    assert wirequant.roundtrip(x, dtype).equal(back)


def test_an_image_activation_crosses_in_a_quarter_then_a_sixth_of_its_float32_bytes():
    x = _x((8, 64, 16, 16))
    f32 = x.numel() * 4
    int8, int4 = (activation_nbytes(wirequant.quantise(x, d)) for d in ("int8", "int4"))
    assert int8 / f32 <= 0.26 and int4 / f32 <= 0.16
    # The sizing the cost model and the cut table read agrees with what is sent (the int4 shape aside).
    assert int8 == 8 * 64 * row_nbytes(256, "int8")
    assert int4 - 4 * 8 == 8 * row_nbytes(64 * 256, "int4")


def test_a_channel_of_fewer_than_a_group_of_values_shares_its_sample_s_scale():
    x = _x((2, 256, 1, 1))  # a pooled activation: per-channel scales would cost more than the values
    q, scale = wirequant.quantise(x, "int8")
    assert scale.shape == (2, 1, 1, 1) and activation_nbytes((q, scale)) < x.numel() * 4


def test_a_hidden_state_s_int8_is_the_formula_per_group_of_32_values_of_a_token():
    h = _x((1, 7, 576), seed=3)
    groups = h.reshape(1, 7, 18, 32)
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
    q = (groups / scale).round().clamp(-127, 127).to(torch.int8)
    got_q, got_scale = wirequant.quantise(h, "int8")
    assert got_q.equal(q.reshape(1, 7, 576)) and got_scale.equal(scale.reshape(1, 7, 18))
    # A hidden size that is not a multiple of 32: one scale for the token, as before.
    odd = _x((1, 3, 40), seed=4)
    assert wirequant.quantise(odd, "int8")[1].shape == (1, 3, 1)


def test_a_live_set_and_token_ids_cross_as_parts_and_come_back():
    a, b = _x((2, 8, 8, 8)), _x((2, 3, 33), seed=1)
    sent = wirequant.encode_activation((a, b), "int4")
    assert len(sent) == 6
    back = wirequant.decode_activation(wirequant.grouped(sent, "int4"), "int4")
    assert back[0].shape == a.shape and back[1].shape == b.shape
    ids = torch.tensor([[1, 2, 3]])
    assert wirequant.encode_activation(ids, "int8") is ids  # not a float32 tensor: as it is


HOSTILE = [
    ("int8", lambda q, s: (q, s[..., :1, :, :].contiguous()), "one float32 scale per row"),
    ("int8", lambda q, s: (q.to(torch.int16), s), "one float32 scale per row"),
    ("int8", lambda q, s: (q, torch.full_like(s, float("inf"))), "NaN or infinity"),
    ("int4", lambda p, s, n: (p, s, torch.tensor([2, -16, 8, 8])), "non-negative int64"),
    ("int4", lambda p, s, n: (p, s, torch.tensor([1] * 9)), "1 to 8"),
    ("int4", lambda p, s, n: (p, s, torch.tensor([2, 16, 8, 9])), "crosses as uint8"),
    ("int4", lambda p, s, n: (p[:, :-1].contiguous(), s, n), "crosses as uint8"),
    ("int4", lambda p, s, n: (p, s.to(torch.float16), n), "crosses as uint8"),
    ("int4", lambda p, s, n: (p, s, torch.tensor([2, 16, 8, 8], dtype=torch.int32)), "int64"),
]


@pytest.mark.parametrize("dtype,tamper,what", HOSTILE, ids=[f"{d}-{w}-{i}" for i, (d, _, w) in enumerate(HOSTILE)])
def test_parts_that_do_not_fit_each_other_are_refused(dtype, tamper, what):
    parts = tamper(*wirequant.quantise(_x((2, 16, 8, 8)), dtype))
    with pytest.raises(WireError, match=what):
        wirequant.dequantise(parts, dtype)


def test_a_frame_of_the_wrong_parts_is_refused_before_decoding():
    q, s = wirequant.quantise(_x((2, 16, 8, 8)), "int8")
    with pytest.raises(WireError, match="crosses as int8 \\+ float32"):
        wirequant.grouped((s, q), "int8")
    with pytest.raises(WireError, match="crosses as uint8 \\+ float32 \\+ int64"):
        wirequant.grouped((q, s), "int4")
