"""Sending (transport.wire.send): zero-copy sends from the tensor's own memory, a queued frame keeping
its tensor alive, a deadline on a slow peer, and real sockets, sealed and plain."""

from __future__ import annotations

import socket
import struct

import pytest
import torch

from paretopipe.transport import wire
from paretopipe.errors import PeerError, WireError
from wire_helpers import FakeSocket


def test_uncompressed_send_is_zero_copy():
    t = torch.randn(1000)
    enc = wire.encode(wire.TENSOR, 0, t)
    payload = memoryview(enc.buffers[1])
    assert payload.nbytes == 4000
    t[0] = 123.0  # the buffer IS the tensor's memory
    assert struct.unpack("<f", bytes(payload[:4]))[0] == 123.0


def test_a_queued_frame_keeps_its_tensor_alive():
    """The payload is laid over the tensor's memory, so it must hold the tensor: a stage drops
    its own reference as soon as the frame is queued for the sender thread."""
    import gc

    enc = wire.encode(wire.TENSOR, 0, torch.arange(1000, dtype=torch.float32))
    gc.collect()
    torch.randn(1000).add_(1)  # reuse freed memory, if any had been freed
    assert struct.unpack("<3f", bytes(memoryview(enc.buffers[1])[4:16])) == (1.0, 2.0, 3.0)


def test_real_socket_roundtrip_of_large_tensor():
    a, b = socket.socketpair()
    t = torch.randn(4, 256, 1024)  # 4 MiB: several partial sends
    import threading

    th = threading.Thread(target=wire.send_frame, args=(a, wire.TENSOR, 9, t))
    th.start()
    f = wire.recv_frame(b)
    th.join()
    assert torch.equal(f.tensor, t)


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


def test_a_plain_live_set_is_sent_from_the_tensors_memory_with_one_validated_header_per_shape():
    a, b = torch.randn(10), torch.arange(4, dtype=torch.int64)
    first = wire.encode(wire.TENSOR, 1, (a, b))
    second = wire.encode(wire.TENSOR, 2, (a, b))
    assert len(first.buffers) == 3 and first.clear_nbytes == wire.HEADER.size + wire.DESCRIPTOR.size
    a[0] = 123.0  # the queued frame's payload IS the tensor's memory
    assert struct.unpack("<f", bytes(memoryview(second.buffers[1])[:4]))[0] == 123.0
    f = wire.recv_frame(FakeSocket(b"".join(bytes(memoryview(x)) for x in second.buffers)))
    assert f.seq == 2 and torch.equal(f.tensor[0], a) and torch.equal(f.tensor[1], b)
