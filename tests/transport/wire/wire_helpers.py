"""What the wire's tests share: a socket that feeds bytes, a round trip, and hand-made headers and
live-set frames (some of them lying)."""

from __future__ import annotations

import io

import torch

from paretopipe.transport import wire


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


def packed_header(shape=(4,), **over):
    fields = dict(magic=wire.MAGIC, version=wire.VERSION, kind=wire.TENSOR, dtype=1, orig=1, codec=0,
                  shuffle=0, ndim=len(shape), meta_len=0, seq=0, nbytes=16, raw=16)
    fields.update(over)
    slots = tuple(shape) + (0,) * (wire.MAX_NDIM - len(shape))
    return wire.HEADER.pack(*fields.values(), *slots[:wire.MAX_NDIM])


LIMIT = 4096


def mixed_live_set():
    return (torch.randn(2, 16, 8, 8), torch.arange(10, dtype=torch.int64).reshape(2, 5),
            torch.tensor([True, False, True]), torch.randn(0, 3))


def live_frame(tensors, extra_override=None, descriptor_edit=None):
    enc = wire.encode(wire.TENSOR, 7, tuple(tensors))
    data = bytearray(b"".join(bytes(memoryview(x)) for x in enc.buffers))
    if extra_override is not None:
        data[wire.EXTRA_OFFSET] = extra_override
    if descriptor_edit is not None:
        descriptor_edit(data)
    return bytes(data)


LIVE_GOOD = live_frame((torch.arange(6.0), torch.arange(4, dtype=torch.int32), torch.ones(2, 2)))
