"""Wire format: exact round trips, strict validation, and a fuzzed decoder that never misbehaves."""

from __future__ import annotations

import io
import socket
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from paretopipe.transport import wire
from paretopipe.errors import PeerError, WireError


class FakeSocket:
    """Feeds bytes to recv_into like a socket whose peer then closes."""

    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    def recv_into(self, view, n=0):
        chunk = self.buf.read(n or len(view))
        view[:len(chunk)] = chunk
        return len(chunk)


def roundtrip(t, codec=None, meta=None, max_payload=wire.DEFAULT_MAX_PAYLOAD):
    enc = wire.encode(wire.TENSOR, 42, t, meta, codec)
    data = b"".join(bytes(memoryview(b)) for b in enc.buffers)
    return wire.recv_frame(FakeSocket(data), max_payload), enc


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


def test_uncompressed_send_is_zero_copy():
    t = torch.randn(1000)
    enc = wire.encode(wire.TENSOR, 0, t)
    payload = enc.buffers[1]
    assert isinstance(payload, memoryview)
    t[0] = 123.0  # the buffer IS the tensor's memory
    assert struct.unpack("<f", bytes(payload[:4]))[0] == 123.0


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

    raw = bytes(wire._tensor_bytes(t))
    unshuffled = len(zstandard.ZstdCompressor(level=3).compress(raw))
    assert payload.wire_nbytes < 0.8 * unshuffled


def test_real_socket_roundtrip_of_large_tensor():
    a, b = socket.socketpair()
    t = torch.randn(4, 256, 1024)  # 4 MiB: several partial sends
    import threading

    th = threading.Thread(target=wire.send_frame, args=(a, wire.TENSOR, 9, t))
    th.start()
    f = wire.recv_frame(b)
    th.join()
    assert torch.equal(f.tensor, t)


def _header(**over):
    fields = dict(magic=wire.MAGIC, version=wire.VERSION, kind=wire.TENSOR, dtype=1, orig=1, codec=0,
                  shuffle=0, ndim=1, meta_len=0, seq=0, nbytes=16, raw=16)
    fields.update(over)
    return wire.HEADER.pack(*fields.values())


@pytest.mark.parametrize("over,match", [
    ({"magic": b"HTTP"}, "bad magic"),
    ({"version": 9}, "wire version 9"),
    ({"kind": 99}, "unknown frame kind"),
    ({"dtype": 77}, "allow-list"),
    ({"codec": 7}, "unknown codec"),
    ({"ndim": 9}, "ndim 9 exceeds"),
    ({"meta_len": 10**6}, "meta of 1000000 bytes exceeds"),
    ({"nbytes": 2**40, "raw": 2**40}, "exceeds the limit"),
    ({"nbytes": 8}, "uncompressed payload of 8 bytes but raw size 16"),
    ({"dtype": 1, "orig": 2}, "torch.float16 tensor cannot travel as torch.float32"),
    ({"dtype": 2, "orig": 9}, "torch.int64 tensor cannot travel as torch.float16"),
])
def test_lying_headers_are_rejected(over, match):
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(_header(**over) + struct.pack("<q", 4) + bytes(16)))


def test_shape_must_match_byte_count():
    with pytest.raises(WireError, match=r"shape \(5,\) .* needs 20 bytes, header says 16"):
        wire.recv_frame(FakeSocket(_header() + struct.pack("<q", 5) + bytes(16)))
    with pytest.raises(WireError, match="negative dimension"):
        wire.recv_frame(FakeSocket(_header(ndim=2) + struct.pack("<qq", -2, -2) + bytes(16)))


def test_truncated_frame_is_a_peer_error():
    good = b"".join(bytes(memoryview(x)) for x in wire.encode(wire.TENSOR, 1, torch.randn(10)).buffers)
    for cut in (0, 10, wire.HEADER.size, len(good) - 1):
        with pytest.raises(PeerError, match="closed the connection"):
            wire.recv_frame(FakeSocket(good[:cut]))


def test_decompression_bomb_is_refused_before_allocation():
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(bytes(10_000_000))
    head = _header(codec=1, shuffle=4, nbytes=len(bomb), raw=16)
    with pytest.raises(WireError, match="claims 10000000 bytes"):
        wire.recv_frame(FakeSocket(head + struct.pack("<q", 4) + bomb))


LIMIT = 4096


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda tail, ndim, nbytes, raw, dtype, codec, meta_len:
              _header(ndim=ndim, nbytes=nbytes, raw=raw, dtype=dtype, codec=codec, meta_len=meta_len) + tail,
              st.binary(max_size=200), st.integers(0, 9), st.integers(0, 2**63 - 1),
              st.integers(0, 2**63 - 1), st.integers(0, 12), st.integers(0, 3), st.integers(0, 70000)),
    st.builds(lambda good, pos, byte: good[:pos] + bytes([byte]) + good[pos + 1:],
              st.just(b"".join(bytes(memoryview(x)) for x in
                               wire.encode(wire.TENSOR, 3, torch.arange(12.0).reshape(3, 4),
                                           {"a": 1}, wire.Codec("lz4")).buffers)),
              st.integers(0, 120), st.integers(0, 255)),
))
def test_fuzzed_decoder_returns_valid_frame_or_project_error(data):
    monkeypatch = pytest.MonkeyPatch()
    allocated = []
    real_empty, real_bytearray = torch.empty, bytearray

    def tracked_empty(*a, **k):
        t = real_empty(*a, **k)
        allocated.append(t.numel() * t.element_size())
        return t

    def tracked_bytearray(n=0):
        allocated.append(n if isinstance(n, int) else len(n))
        return real_bytearray(n)

    monkeypatch.setattr(wire.torch, "empty", tracked_empty)
    monkeypatch.setattr(wire, "bytearray", tracked_bytearray, raising=False)
    try:
        f = wire.recv_frame(FakeSocket(data), max_payload=LIMIT)
    except (WireError, PeerError):
        pass
    else:
        assert f.kind in wire.KIND_NAMES
        if f.tensor is not None:  # raw bytes are in the wire dtype; the tensor is back in its own
            wire_dtype = wire.DTYPES[wire.parse_header(data[:wire.HEADER.size], LIMIT).dtype]
            assert f.tensor.numel() * wire_dtype.itemsize == f.raw_nbytes <= LIMIT
    finally:
        monkeypatch.undo()
    assert all(n <= max(LIMIT, wire.MAX_META_BYTES) for n in allocated)
