"""Wire format: exact round trips, strict validation, and a fuzzed decoder that never misbehaves."""

from __future__ import annotations

import io
import socket
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from paretopipe.partition.activation import live_tensors
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
    payload = memoryview(enc.buffers[1])
    assert payload.nbytes == 4000
    t[0] = 123.0  # the buffer IS the tensor's memory
    assert struct.unpack("<f", bytes(payload[:4]))[0] == 123.0


def test_lazily_negated_views_travel_as_their_values():
    """The payload is read straight from memory, where a neg view keeps the un-negated values."""
    view = torch._neg_view(torch.tensor([1.0, 2.0, 3.0]))
    for _ in range(2):  # the second frame takes the cached-header path
        f, _ = roundtrip(view)
        assert f.tensor.tolist() == [-1.0, -2.0, -3.0]


def test_a_queued_frame_keeps_its_tensor_alive():
    """The payload is laid over the tensor's memory, so it must hold the tensor: a stage drops
    its own reference as soon as the frame is queued for the sender thread."""
    import gc

    enc = wire.encode(wire.TENSOR, 0, torch.arange(1000, dtype=torch.float32))
    gc.collect()
    torch.randn(1000).add_(1)  # reuse freed memory, if any had been freed
    assert struct.unpack("<3f", bytes(memoryview(enc.buffers[1])[4:16])) == (1.0, 2.0, 3.0)


def test_float16_wire_dtype_halves_bytes_and_casts_back():
    t = torch.randn(8, 16)
    f, enc = roundtrip(t, wire.Codec(wire_dtype="float16"))
    assert enc.wire_nbytes == t.numel() * 2
    assert f.tensor.dtype == torch.float32
    assert torch.allclose(f.tensor, t, atol=1e-2)


def test_a_live_set_of_mixed_dtypes_decodes_whatever_offset_each_tensor_lands_at():
    # 3 int8 bytes put the float32 tensor at offset 3, and 11 bytes the int64 one at 11: neither
    # can be viewed there, so each is copied out (int8 values and their scales cross this way).
    sent = (torch.tensor([1, -2, 3], dtype=torch.int8), torch.tensor([0.5, -1.5]), torch.tensor([7], dtype=torch.int64))
    f, _ = roundtrip(sent)
    assert len(f.tensor) == 3 and all(g.dtype == s.dtype and g.equal(s) for g, s in zip(f.tensor, sent))


def test_shuffle_makes_compression_see_the_element_size():
    # Smooth float data: byte-shuffling groups exponent bytes, which zstd then squeezes.
    t = torch.linspace(0, 1, 100_000)
    payload = wire.encode_payload(t, wire.Codec("zstd"))
    assert payload.shuffle == 4
    import zstandard

    raw = bytes(wire.tensor_bytes(t))
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


def _header(shape=(4,), **over):
    fields = dict(magic=wire.MAGIC, version=wire.VERSION, kind=wire.TENSOR, dtype=1, orig=1, codec=0,
                  shuffle=0, ndim=len(shape), meta_len=0, seq=0, nbytes=16, raw=16)
    fields.update(over)
    slots = tuple(shape) + (0,) * (wire.MAX_NDIM - len(shape))
    return wire.HEADER.pack(*fields.values(), *slots[:wire.MAX_NDIM])


@pytest.mark.parametrize("over,match", [
    ({"magic": b"HTTP"}, "bad magic"),
    ({"version": 9}, "wire version 9"),
    ({"kind": 99}, "unknown frame kind"),
    ({"dtype": 77}, "allow-list"),
    ({"codec": 7}, "unknown codec"),
    ({"ndim": 9}, "ndim 9 exceeds"),
    ({"ndim": 0}, "shape slots beyond ndim 0 are not zero"),
    ({"meta_len": 10**6}, "meta of 1000000 bytes exceeds"),
    ({"nbytes": 2**40, "raw": 2**40}, "exceeds the limit"),
    ({"nbytes": 8}, "uncompressed payload of 8 bytes but raw size 16"),
    ({"dtype": 1, "orig": 2}, "torch.float16 tensor cannot travel as torch.float32"),
    ({"dtype": 2, "orig": 9}, "torch.int64 tensor cannot travel as torch.float16"),
    ({"dtype": 2, "orig": 4}, "torch.float64 tensor cannot travel as torch.float16"),
    ({"shuffle": 4}, "uncompressed payload cannot be shuffled"),
    ({"codec": 1, "nbytes": 0}, "compressed payload of 0 bytes cannot decode to 16 bytes"),  # found by the fuzzer
])
def test_lying_headers_are_rejected(over, match):
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(_header(**over) + bytes(16)))


def test_a_reader_skips_revalidating_only_headers_it_has_already_validated():
    """The reader remembers the last valid header (sequence number aside): repeats keep their own
    sequence numbers, and a header differing in any other byte is checked afresh and refused."""
    a, b = socket.socketpair()
    with a, b:
        for seq in (7, 8):
            a.sendall(_header(seq=seq) + struct.pack("<4f", seq, 1, 2, 3))
        a.sendall(_header(shape=(5,), seq=9) + bytes(16))  # lies: 5 floats need 20 bytes
        reader = wire.FrameReader(b, pool=wire.BufferPool())
        frames = [reader.read(), reader.read()]
        assert [f.seq for f in frames] == [7, 8]
        assert frames[1].tensor.tolist() == [8.0, 1.0, 2.0, 3.0]
        with pytest.raises(WireError, match=r"shape \(5,\) .* needs 20 bytes"):
            reader.read()


def test_read_ahead_reader_keeps_large_and_small_frames_apart():
    """Large payloads are read in one blocking call up to their tail, the tail with the next
    header: a mix of 3 MB, 5-byte and metadata frames, back to back, arrives intact and in order."""
    import threading

    a, b = socket.socketpair()
    big = [torch.randn(3, 256, 1024) for _ in range(3)]
    frames = [(big[0], None), (torch.arange(5.0), None), (big[1], {"k": 1}), (big[2], None), (None, {"end": 1})]

    def send():
        writer = wire.FrameWriter(a)
        for seq, (t, meta) in enumerate(frames):
            writer.send(wire.encode(wire.TENSOR if t is not None else wire.BYE, seq, t, meta))

    th = threading.Thread(target=send)
    th.start()
    reader = wire.FrameReader(b, pool=wire.BufferPool())
    for seq, (t, meta) in enumerate(frames):
        f = reader.read()
        assert f.seq == seq and f.meta == (meta or {})
        assert (f.tensor is None) if t is None else torch.equal(f.tensor, t)
        f.release()
    th.join()
    a.close(), b.close()


def test_shape_must_match_byte_count():
    with pytest.raises(WireError, match=r"shape \(5,\) .* needs 20 bytes, header says 16"):
        wire.recv_frame(FakeSocket(_header(shape=(5,)) + bytes(16)))
    with pytest.raises(WireError, match="negative dimension"):
        wire.recv_frame(FakeSocket(_header(shape=(-2, -2)) + bytes(16)))


def test_overflowing_empty_shapes_are_refused():
    """The attack that killed the listener: float32 (2^62, 2^62, 0) with 0 payload bytes."""
    with pytest.raises(WireError, match="larger than any tensor"):
        wire.recv_frame(FakeSocket(_header(shape=(2**62, 2**62, 0), nbytes=0, raw=0)))
    f = wire.recv_frame(FakeSocket(_header(shape=(3, 0, 7), nbytes=0, raw=0)))  # an honest empty tensor
    assert tuple(f.tensor.shape) == (3, 0, 7)


def test_decoding_never_allocates_more_than_the_limit_allows():
    # A float16 frame of 1 KiB decoding to float32 needs 2 KiB: refused under a 1.5 KiB limit.
    head = _header(shape=(512,), dtype=2, orig=1, nbytes=1024, raw=1024)
    with pytest.raises(WireError, match="decoded tensor would take 2048 bytes"):
        wire.recv_frame(FakeSocket(head + bytes(1024)), max_payload=1536)
    assert wire.recv_frame(FakeSocket(head + bytes(1024)), max_payload=2048).tensor.dtype == torch.float32


@pytest.mark.parametrize("meta, match", [
    (b"[" * 60000, "nested deeper than 16"),
    (b'{"n": ' + b"9" * 5000 + b"}", "JSON number of 5000 characters"),
    (b'{"x": NaN}', "constant NaN"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_hostile_meta_is_a_wire_error(meta, match):
    head = _header(shape=(), kind=wire.HELLO, dtype=0, orig=0, nbytes=0, raw=0, meta_len=len(meta))
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(head + meta))


def test_a_deadline_bounds_a_slow_sender():
    import threading
    import time

    a, b = socket.socketpair()
    data = b"".join(bytes(memoryview(x)) for x in wire.encode(wire.HELLO, 0, meta={"x": 1}).buffers)

    def drip():
        for byte in data:
            try:
                a.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.05)

    threading.Thread(target=drip, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(PeerError, match="missed its deadline|timed out"):
        wire.recv_frame(b, deadline=time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 1.0
    a.close()
    b.close()


def test_pooled_buffers_are_reused_after_release():
    a, b = socket.socketpair()
    pool = wire.BufferPool()
    t = torch.randn(1000)
    seen = set()
    for seq in range(5):
        wire.send_frame(a, wire.TENSOR, seq, t)
        f = wire.recv_frame(b, pool=pool)
        assert torch.equal(f.tensor, t)
        seen.add(f.tensor.data_ptr())
        f.release()
        assert f.tensor is None
    assert pool.allocated == 1 and len(seen) == 1  # one buffer, reused four times
    wire.send_frame(a, wire.TENSOR, 9, t)
    kept = wire.recv_frame(b, pool=pool)  # not released: the next frame gets a buffer of its own
    wire.send_frame(a, wire.TENSOR, 10, t)
    other = wire.recv_frame(b, pool=pool)
    assert kept.tensor.data_ptr() != other.tensor.data_ptr() and torch.equal(kept.tensor, t)
    a.close()
    b.close()


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
        wire.recv_frame(FakeSocket(head + bomb))


LIMIT = 4096


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda tail, shape, nbytes, raw, dtype, codec, meta_len:
              _header(shape=shape, nbytes=nbytes, raw=raw, dtype=dtype, codec=codec, meta_len=meta_len) + tail,
              st.binary(max_size=200), st.lists(st.integers(-2, 2**62), max_size=8), st.integers(0, 2**63 - 1),
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

    monkeypatch.setattr(torch, "empty", tracked_empty)
    for module in (wire.reader, wire.buffers, wire.codecs):  # every module that allocates what a frame claims
        monkeypatch.setattr(module, "bytearray", tracked_bytearray, raising=False)
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


# -- live sets: several tensors in one frame ---------------------------------------------------------

def _live_set():
    return (torch.randn(2, 16, 8, 8), torch.arange(10, dtype=torch.int64).reshape(2, 5),
            torch.tensor([True, False, True]), torch.randn(0, 3))


@pytest.mark.parametrize("codec", [None, wire.Codec("zstd"), wire.Codec("lz4", 1, "float16"),
                                   wire.Codec("none", 3, "bfloat16")])
def test_a_live_set_of_mixed_dtypes_and_shapes_roundtrips_with_per_tensor_codecs(codec):
    tensors = _live_set()
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


def test_a_live_set_over_a_real_socket_sealed_and_pooled_and_mixed_with_single_frames():
    from paretopipe.transport import aead

    key = bytes(range(32))
    a, b = socket.socketpair()
    pool = wire.BufferPool()
    writer = wire.FrameWriter(a, aead.Direction("chacha20", key))
    reader = wire.FrameReader(b, pool=pool, opener=aead.Direction("chacha20", key))
    try:
        for seq in range(3):
            tensors = (torch.randn(1, 24, 28, 28) + seq, torch.randn(1, 32, 14, 14))
            writer.send(wire.encode(wire.TENSOR, seq, tensors))
            writer.send(wire.encode(wire.TENSOR, 100 + seq, tensors[0], {"one": True}))
            f = reader.read()
            assert f.seq == seq and all(torch.equal(x, y) for x, y in zip(f.tensor, tensors))
            f.release()
            g = reader.read()
            assert g.seq == 100 + seq and torch.equal(g.tensor, tensors[0]) and g.meta == {"one": True}
            g.release()
        assert pool.allocated == 2  # the live set's one buffer is reused frame after frame
    finally:
        a.close()
        b.close()


def test_a_tampered_descriptor_on_a_sealed_connection_is_refused():
    from paretopipe.transport import aead

    key = bytes(range(32))
    a, b = socket.socketpair()
    sent = []
    sealer = aead.Direction("chacha20", key)
    try:
        enc = wire.encode(wire.TENSOR, 0, (torch.ones(4), torch.ones(2, 2)))
        header = bytes(enc.buffers[0][:enc.clear_nbytes])
        sealed = sealer.seal(header, b"".join(bytes(memoryview(x)) for x in enc.buffers[1:]))
        data = bytearray(header + bytes(sealed))
        sent.append(bytes(data))
        # Swap the second tensor's shape (2, 2) for (4, 1): the same bytes, another tensor.
        forged = bytearray(data)
        struct.pack_into("<2q", forged, wire.HEADER.size + 24, 4, 1)
        a.sendall(bytes(data) + bytes(forged))
        reader = wire.FrameReader(b, opener=aead.Direction("chacha20", key))
        assert reader.read().tensor[1].shape == (2, 2)
        with pytest.raises(WireError):
            reader.read()
    finally:
        a.close()
        b.close()


def _live_frame(tensors, extra_override=None, descriptor_edit=None):
    enc = wire.encode(wire.TENSOR, 7, tuple(tensors))
    data = bytearray(b"".join(bytes(memoryview(x)) for x in enc.buffers))
    if extra_override is not None:
        data[wire.EXTRA_OFFSET] = extra_override
    if descriptor_edit is not None:
        descriptor_edit(data)
    return bytes(data)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.__setitem__(wire.HEADER.size, 99), "not in the allow-list"),
    (lambda d: d.__setitem__(wire.HEADER.size, 0), "has no dtype"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24, 3), "needs .* bytes"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24, -1), "negative dimension"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24 + 8 * 7, 5), "beyond ndim"),
    (lambda d: struct.pack_into("<QQ", d, wire.HEADER.size + 8, 8, 4), "uncompressed payload of 8 bytes"),
    (lambda d: d.__setitem__(wire.HEADER.size + 4, 9), "exceeds the limit of 8"),
])
def test_a_lying_descriptor_is_refused(edit, match):
    data = _live_frame((torch.ones(4), torch.ones(2)), descriptor_edit=edit)
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(data))


def test_the_payload_cap_holds_over_the_sum_of_a_live_sets_tensors():
    tensors = (torch.ones(500), torch.ones(500), torch.ones(500))  # 2000 bytes each, 6000 together
    data = _live_frame(tensors)
    assert len(wire.recv_frame(FakeSocket(data), max_payload=6000).tensor) == 3
    with pytest.raises(WireError, match="3 tensors take 6000 bytes .* over the limit of 4096"):
        wire.recv_frame(FakeSocket(data), max_payload=4096)


def test_too_many_tensors_or_further_tensors_without_a_first_are_refused():
    with pytest.raises(WireError, match="a frame of 17 tensors; the limit is 16"):
        wire.recv_frame(FakeSocket(_live_frame((torch.ones(1), torch.ones(1)), extra_override=16)))
    empty = bytearray(wire.encode(wire.BYE, 0).buffers[0])
    empty[wire.EXTRA_OFFSET] = 1
    with pytest.raises(WireError, match="without a tensor declares further tensors"):
        wire.recv_frame(FakeSocket(bytes(empty)))
    with pytest.raises(WireError, match="2 to 16 tensors"):
        wire.encode(wire.TENSOR, 0, tuple(torch.ones(1) for _ in range(17)))


_LIVE_GOOD = _live_frame((torch.arange(6.0), torch.arange(4, dtype=torch.int32), torch.ones(2, 2)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.builds(lambda pos, byte: _LIVE_GOOD[:pos] + bytes([byte]) + _LIVE_GOOD[pos + 1:],
              st.integers(0, wire.HEADER.size + 2 * wire.DESCRIPTOR.size + 8), st.integers(0, 255)),
    st.builds(lambda cut: _LIVE_GOOD[:cut], st.integers(0, len(_LIVE_GOOD) - 1)),
    st.builds(lambda extra, tail: _LIVE_GOOD[:wire.EXTRA_OFFSET] + bytes([extra]) +
              _LIVE_GOOD[wire.EXTRA_OFFSET + 1:wire.HEADER.size] + tail,
              st.integers(0, 255), st.binary(max_size=400)),
))
def test_fuzzed_live_set_frames_decode_to_valid_tensors_or_a_project_error(data):
    try:
        f = wire.recv_frame(FakeSocket(data), max_payload=LIMIT)
    except (WireError, PeerError):
        return
    tensors = live_tensors(f.tensor)
    assert 1 <= len(tensors) <= wire.MAX_TENSORS
    assert sum(t.numel() * t.element_size() for t in tensors) <= LIMIT


def test_a_plain_live_set_is_sent_from_the_tensors_memory_with_one_validated_header_per_shape():
    a, b = torch.randn(10), torch.arange(4, dtype=torch.int64)
    first = wire.encode(wire.TENSOR, 1, (a, b))
    second = wire.encode(wire.TENSOR, 2, (a, b))
    assert len(first.buffers) == 3 and first.clear_nbytes == wire.HEADER.size + wire.DESCRIPTOR.size
    a[0] = 123.0  # the queued frame's payload IS the tensor's memory
    assert struct.unpack("<f", bytes(memoryview(second.buffers[1])[:4]))[0] == 123.0
    f = wire.recv_frame(FakeSocket(b"".join(bytes(memoryview(x)) for x in second.buffers)))
    assert f.seq == 2 and torch.equal(f.tensor[0], a) and torch.equal(f.tensor[1], b)
