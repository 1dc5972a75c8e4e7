"""Reading (transport.wire.reader): a reader that validates each new header once, reads ahead without
mixing frames, refuses a truncated frame, and a fuzzed decoder that never misbehaves."""

from __future__ import annotations

import socket
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from paretopipe.partition.activation import live_tensors
from paretopipe.transport import wire
from paretopipe.errors import PeerError, WireError
from wire_helpers import FakeSocket, LIMIT, LIVE_GOOD, packed_header


def test_a_reader_skips_revalidating_only_headers_it_has_already_validated():
    """The reader remembers the last valid header (sequence number aside): repeats keep their own
    sequence numbers, and a header differing in any other byte is checked afresh and refused."""
    a, b = socket.socketpair()
    with a, b:
        for seq in (7, 8):
            a.sendall(packed_header(seq=seq) + struct.pack("<4f", seq, 1, 2, 3))
        a.sendall(packed_header(shape=(5,), seq=9) + bytes(16))  # lies: 5 floats need 20 bytes
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


def test_decoding_never_allocates_more_than_the_limit_allows():
    # A float16 frame of 1 KiB decoding to float32 needs 2 KiB: refused under a 1.5 KiB limit.
    head = packed_header(shape=(512,), dtype=2, orig=1, nbytes=1024, raw=1024)
    with pytest.raises(WireError, match="decoded tensor would take 2048 bytes"):
        wire.recv_frame(FakeSocket(head + bytes(1024)), max_payload=1536)
    assert wire.recv_frame(FakeSocket(head + bytes(1024)), max_payload=2048).tensor.dtype == torch.float32


def test_truncated_frame_is_a_peer_error():
    good = b"".join(bytes(memoryview(x)) for x in wire.encode(wire.TENSOR, 1, torch.randn(10)).buffers)
    for cut in (0, 10, wire.HEADER.size, len(good) - 1):
        with pytest.raises(PeerError, match="closed the connection"):
            wire.recv_frame(FakeSocket(good[:cut]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda tail, shape, nbytes, raw, dtype, codec, meta_len:
              packed_header(shape=shape, nbytes=nbytes, raw=raw, dtype=dtype, codec=codec, meta_len=meta_len) + tail,
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.builds(lambda pos, byte: LIVE_GOOD[:pos] + bytes([byte]) + LIVE_GOOD[pos + 1:],
              st.integers(0, wire.HEADER.size + 2 * wire.DESCRIPTOR.size + 8), st.integers(0, 255)),
    st.builds(lambda cut: LIVE_GOOD[:cut], st.integers(0, len(LIVE_GOOD) - 1)),
    st.builds(lambda extra, tail: LIVE_GOOD[:wire.EXTRA_OFFSET] + bytes([extra]) +
              LIVE_GOOD[wire.EXTRA_OFFSET + 1:wire.HEADER.size] + tail,
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
