"""How a tensor becomes a payload and back: the sender's codec choice (a cast to float16 or
bfloat16, zstd or lz4 after a byte shuffle), a zero-copy byte view of a tensor, and the payload
before framing."""

from __future__ import annotations

import ctypes
import dataclasses
import time
from typing import Any

import numpy as np
import torch

from ...errors import UsageError, WireError
from .layout import CAST_FROM, CODECS, DTYPE_CODES, MAX_NDIM, NO_TENSOR, WIRE_DTYPES

@dataclasses.dataclass
class Codec:
    """How a sender encodes tensor payloads. Both choices are recorded with their cost."""

    compression: str = "none"
    level: int = 3
    wire_dtype: str = "float32"

    @property
    def is_plain(self) -> bool:
        """Tensors go out as they are: no compression, no cast."""
        return self.compression == "none" and self.wire_dtype == "float32"

    def __post_init__(self) -> None:
        if self.compression not in CODECS:
            raise UsageError(f"unknown compression {self.compression!r}; valid: {', '.join(CODECS)}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise UsageError(f"unknown wire dtype {self.wire_dtype!r}; valid: {', '.join(WIRE_DTYPES)}")


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor, which it keeps alive.

    A ctypes array laid over the tensor's memory, not ``t.numpy()``: numpy's view costs 1.6 us a
    frame, and at 0.1 MB frames every microsecond on the sender's side costs about 3% of loopback
    goodput (benchmarks/transport.py). The array holds the tensor, and the view holds the array,
    so the memory cannot be freed while the view is in use. It also covers bfloat16, which numpy
    lacks. (ctypes caches ``c_ubyte * n`` itself.)"""
    nbytes = t.nbytes
    if not nbytes:
        return memoryview(b"")
    array = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    array.owner = t
    return memoryview(array).cast("B")


def shuffle_bytes(raw: memoryview, itemsize: int) -> bytes:
    """Byte-shuffle (all first bytes, then all second bytes, ...): makes floats compressible."""
    if itemsize <= 1:
        return bytes(raw)
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, itemsize).T.tobytes()


def unshuffle_bytes(data: bytes, itemsize: int) -> np.ndarray:
    arr = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        return arr.copy()  # writable, like every tensor we hand out
    return arr.reshape(itemsize, -1).T.copy().reshape(-1)


def compress(codec: str, data: bytes, level: int) -> bytes:
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=level).compress(data)
    import lz4.block

    return lz4.block.compress(data, mode="fast", acceleration=max(1, level), store_size=False)


def decompress(codec: str, data: Any, raw_nbytes: int) -> bytes:
    try:
        if codec == "zstd":
            import zstandard

            claimed = zstandard.frame_content_size(data)
            if claimed != raw_nbytes:  # checked before allocating what the frame claims
                raise WireError(f"zstd frame claims {claimed} bytes, header says {raw_nbytes}")
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_nbytes)
        else:
            import lz4.block

            out = lz4.block.decompress(data, uncompressed_size=raw_nbytes)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"corrupt {codec} payload: {exc}")
    if len(out) != raw_nbytes:
        raise WireError(f"{codec} payload decompressed to {len(out)} bytes, header says {raw_nbytes}")
    return out


@dataclasses.dataclass(slots=True)
class Payload:
    """An encoded tensor (cast and/or compressed), before framing."""

    dtype: int = NO_TENSOR
    orig_dtype: int = NO_TENSOR
    codec: int = 0
    shuffle: int = 0
    shape: tuple[int, ...] = ()
    data: Any = b""
    raw_nbytes: int = 0
    encode_s: float = 0.0
    wire_nbytes: int = 0  # the bytes of ``data``, counted once (a memoryview per call costs 0.3 us)


def encode_payload(tensor: torch.Tensor | tuple[torch.Tensor, ...] | None, codec: Codec | None = None
                   ) -> Payload | list[Payload]:
    """Cast/compress a tensor per ``codec``; uncompressed data stays a view of the tensor's memory.
    A live set of several tensors gives one payload each, cast and compressed on its own."""
    if isinstance(tensor, tuple):
        return [encode_payload(t, codec) for t in tensor]
    if tensor is None:
        return Payload()
    t0 = time.perf_counter()
    t = tensor.detach() if tensor.requires_grad else tensor
    if not t.is_cpu:  # not t.device.type: building a device object costs 0.5 us a frame
        t = t.cpu()
    orig_code = DTYPE_CODES.get(t.dtype)
    if orig_code is None:
        raise WireError(f"dtype {t.dtype} is not allowed on the wire; allowed: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPE_CODES)}")
    if codec is not None:
        target = WIRE_DTYPES[codec.wire_dtype]
        if target is not None and orig_code == CAST_FROM:
            t = t.to(target)
    if t.is_neg():  # a lazily negated view: its memory holds the values before negation
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() > MAX_NDIM:
        raise WireError(f"tensor has {t.dim()} dims; the wire allows at most {MAX_NDIM}")
    raw = tensor_bytes(t)
    out = Payload(DTYPE_CODES[t.dtype], orig_code, 0, 0, tuple(t.shape), raw, raw.nbytes, 0.0, raw.nbytes)
    if codec is not None and codec.compression != "none" and raw.nbytes:
        out.shuffle = t.element_size()
        out.data = compress(codec.compression, shuffle_bytes(raw, out.shuffle), codec.level)
        out.wire_nbytes = len(out.data)
        out.codec = CODECS[codec.compression]
    out.encode_s = time.perf_counter() - t0
    return out
