"""Codecs (transport.wire.codecs): a cast on the wire, byte shuffling ahead of compression, and a
decompression bomb refused before anything is allocated."""

from __future__ import annotations


import pytest
import torch

from paretopipe.transport import wire
from paretopipe.errors import WireError
from wire_helpers import FakeSocket, packed_header, roundtrip


def test_float16_wire_dtype_halves_bytes_and_casts_back():
    t = torch.randn(8, 16)
    f, enc = roundtrip(t, wire.Codec(wire_dtype="float16"))
    assert enc.wire_nbytes == t.numel() * 2
    assert f.tensor.dtype == torch.float32
    assert torch.allclose(f.tensor, t, atol=1e-2)


def test_shuffle_makes_compression_see_the_element_size():
    # Smooth float data: byte-shuffling groups exponent bytes, which zstd then squeezes.
    t = torch.linspace(0, 1, 100_000)
    payload = wire.encode_payload(t, wire.Codec("zstd"))
    assert payload.shuffle == 4
    import zstandard

    raw = bytes(wire.tensor_bytes(t))
    unshuffled = len(zstandard.ZstdCompressor(level=3).compress(raw))
    assert payload.wire_nbytes < 0.8 * unshuffled


def test_decompression_bomb_is_refused_before_allocation():
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(bytes(10_000_000))
    head = packed_header(codec=1, shuffle=4, nbytes=len(bomb), raw=16)
    with pytest.raises(WireError, match="claims 10000000 bytes"):
        wire.recv_frame(FakeSocket(head + bomb))
