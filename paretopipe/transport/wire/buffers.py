"""Receive buffers reused frame after frame (a run receives one payload size per direction, so
after the first frame nothing is allocated or page-faulted again), and the received frame that
holds one until its consumer releases it."""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import torch

class ReceiveBuffer:
    """A receive buffer: the tensor, its byte view for ``recv_into``, and the typed views handed
    out before (a run receives one dtype and shape per direction, so they are made once)."""

    __slots__ = ("tensor", "view", "typed")

    def __init__(self, nbytes: int) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        self.view = memoryview(self.tensor.numpy()).cast("B")
        self.typed: dict[tuple, torch.Tensor] = {}

    def as_tensor(self, dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if offset % dtype.itemsize:
            # A live set of mixed dtypes (int8 values, then their float32 scales) can put a tensor
            # at an offset its dtype cannot be viewed at: it is copied out (the small ones, after
            # the large tensor that starts the buffer).
            t = torch.empty(shape, dtype=dtype)
            t.view(-1).view(torch.uint8).copy_(self.tensor[offset:offset + nbytes])
            return t
        key = (dtype, shape, offset)
        t = self.typed.get(key)
        if t is None:
            # A sealed frame's buffer holds its tag after the payload; a live set's tensors lie one
            # after another.
            whole = self.tensor if nbytes == self.tensor.numel() else self.tensor[offset:offset + nbytes]
            t = self.typed[key] = whole.view(dtype).reshape(shape)
        return t


def consume(views: list[memoryview], n: int) -> int:
    """Drop ``n`` bytes from the front of a scatter list in place (after a partial send or
    receive); returns how many of them lay past its end (0 when it did not run out)."""
    while n and views:
        if n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        else:
            views[0] = views[0][n:]
            n = 0
    return n


class BufferPool:
    """Receive buffers reused frame after frame. ``take`` hands one out; whoever holds the frame
    gives it back with :meth:`Frame.release`. At most ``max_bytes`` are kept idle."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[ReceiveBuffer]] = {}
        self._idle = 0
        self._lock = threading.Lock()
        self.allocated = 0  # how many buffers had to be allocated (benchmarks and tests read it)

    def take(self, nbytes: int) -> ReceiveBuffer:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._idle -= nbytes
                return free.pop()
            self.allocated += 1
        return ReceiveBuffer(nbytes)

    def give(self, buf: ReceiveBuffer) -> None:
        n = buf.view.nbytes
        with self._lock:
            if self._idle + n <= self.max_bytes:
                self._free.setdefault(n, []).append(buf)
                self._idle += n


@dataclasses.dataclass(slots=True)
class Frame:
    kind: int
    seq: int
    tensor: torch.Tensor | tuple[torch.Tensor, ...] | None  # a tuple: a live set of several tensors
    meta: dict[str, Any]
    raw_nbytes: int = 0
    wire_nbytes: int = 0
    decode_s: float = 0.0
    open_s: float = 0.0    # opening it, on a sealed connection
    _buffer: ReceiveBuffer | None = None
    _pool: BufferPool | None = None

    def release(self) -> None:
        """Give a pooled receive buffer back; the tensor must not be used afterwards."""
        if self._buffer is not None and self._pool is not None:
            self._pool.give(self._buffer)
        self._buffer = self._pool = None
        self.tensor = None
