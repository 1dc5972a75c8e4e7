"""Pooled receive buffers (transport.wire.buffers): reused once released."""

from __future__ import annotations

import socket

import torch

from paretopipe.transport import wire


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
