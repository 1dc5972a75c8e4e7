"""Frames (transport.wire.frames): every allowed dtype and odd shape, views and live sets of mixed
dtypes, encoded and decoded back exactly."""

from __future__ import annotations


import pytest
import torch

from paretopipe.transport import wire
from wire_helpers import mixed_live_set, roundtrip


@pytest.mark.parametrize("dtype", list(wire.DTYPE_CODES))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 3, 5), (1, 1, 1, 1, 1, 1, 1, 7)])
def test_every_allowed_dtype_and_odd_shapes_roundtrip(dtype, shape):
    t = (torch.randn(shape) * 100).to(dtype)
    for codec in (wire.Codec(), wire.Codec("zstd"), wire.Codec("lz4")):
        f, enc = roundtrip(t, codec, {"k": [1, 2]})
        assert f.kind == wire.TENSOR and f.seq == 42 and f.meta == {"k": [1, 2]}
        assert f.tensor.dtype == dtype and tuple(f.tensor.shape) == shape
        assert torch.equal(f.tensor, t)
        assert enc.raw_nbytes == t.numel() * t.element_size()


def test_non_contiguous_input_roundtrips():
    t = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5).permute(2, 0, 1)[:, ::2]
    assert not t.is_contiguous()
    f, _ = roundtrip(t)
    assert torch.equal(f.tensor, t)


def test_lazily_negated_views_travel_as_their_values():
    """The payload is read straight from memory, where a neg view keeps the un-negated values."""
    view = torch._neg_view(torch.tensor([1.0, 2.0, 3.0]))
    for _ in range(2):  # the second frame takes the cached-header path
        f, _ = roundtrip(view)
        assert f.tensor.tolist() == [-1.0, -2.0, -3.0]


def test_a_live_set_of_mixed_dtypes_decodes_whatever_offset_each_tensor_lands_at():
    # 3 int8 bytes put the float32 tensor at offset 3, and 11 bytes the int64 one at 11: neither
    # can be viewed there, so each is copied out (int8 values and their scales cross this way).
    sent = (torch.tensor([1, -2, 3], dtype=torch.int8), torch.tensor([0.5, -1.5]), torch.tensor([7], dtype=torch.int64))
    f, _ = roundtrip(sent)
    assert len(f.tensor) == 3 and all(g.dtype == s.dtype and g.equal(s) for g, s in zip(f.tensor, sent))


@pytest.mark.parametrize("codec", [None, wire.Codec("zstd"), wire.Codec("lz4", 1, "float16"),
                                   wire.Codec("none", 3, "bfloat16")])
def test_a_live_set_of_mixed_dtypes_and_shapes_roundtrips_with_per_tensor_codecs(codec):
    tensors = mixed_live_set()
    f, enc = roundtrip(tensors, codec, {"k": 1})
    assert isinstance(f.tensor, tuple) and len(f.tensor) == len(tensors) and f.meta == {"k": 1}
    for got, sent in zip(f.tensor, tensors):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        if sent.dtype == torch.float32 and codec is not None and codec.wire_dtype != "float32":
            # only float32 is cast, each tensor on its own; the others travel exactly
            assert torch.allclose(got, sent, atol=0.05, rtol=0.01)
        else:
            assert torch.equal(got, sent)
    cast = codec is not None and codec.wire_dtype != "float32"
    expected_raw = sum(t.numel() * (2 if cast and t.dtype == torch.float32 else t.element_size()) for t in tensors)
    assert f.raw_nbytes == enc.raw_nbytes == expected_raw
