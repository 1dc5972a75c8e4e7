"""What crosses a cut in fewer bits: the wire dtypes of every model, and their round trip.

``float16`` and ``bfloat16`` are casts (the frame's codec casts a float32 tensor and the receiver
casts it back). ``int8`` and ``int4`` are quantisations made here, before the codec, and sent as a
few tensors in one frame (a live set), for an image model's activations and a language model's
hidden state alike:

- ``int8``: symmetric, one float32 scale per row: a sample's channel of an image activation
  ``(N, C, H, W)`` (the whole sample where a channel holds fewer than :data:`INT4_GROUP` values,
  so that scales never cost more than an eighth of a byte a value), a sample of ``(N, F)``; a
  hidden state ``(B, T, D)`` has one per group of :data:`INT4_GROUP` values of a token
  (:func:`paretopipe.wiredtype.int8_token_groups`: a trained model's outlier channels); crosses
  as the int8 tensor and its scales.
- ``int4``: symmetric, two values per byte, one float32 scale per group of :data:`INT4_GROUP`
  consecutive values of a row (a sample of an image activation, channel after channel; a token of
  a hidden state; zero-padded to whole groups); crosses as the packed bytes, the scales and the
  tensor's shape (int64), which the receiver needs to unpack.

Only float32 tensors are quantised (a language model's token ids cross as they are). A receiver
checks every part against the others before it allocates anything (:func:`decode_activation`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, TypeVar

import torch

from ..errors import WireError
from ..wiredtype import INT4_GROUP, QUANTISED, int8_token_groups
from .activation import Activation, live_tensors

CASTS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: The dtypes of the tensors one float32 tensor crosses as, in each wire dtype.
PART_DTYPES = {"float32": (torch.float32,), "float16": (torch.float16,), "bfloat16": (torch.bfloat16,),
               "int8": (torch.int8, torch.float32), "int4": (torch.uint8, torch.float32, torch.int64)}
_MAX_NDIM = 8
T = TypeVar("T")


def _lead(shape: tuple[int, ...], dtype: str) -> int:
    """How many leading dimensions index a row (the rest are the row's values)."""
    if len(shape) <= 1:
        return 0
    if len(shape) == 3:
        return 2  # a token of (B, T, D)
    channel_rows = len(shape) >= 4 and dtype == "int8" and math.prod(shape[2:]) >= INT4_GROUP
    return 2 if channel_rows else 1


def _rows(shape: tuple[int, ...], dtype: str) -> tuple[int, int]:
    """(rows, values per row) of a tensor's shape."""
    rows = math.prod(shape[:_lead(shape, dtype)])
    return rows, (math.prod(shape) // rows if rows else 0)


def _token_groups(shape: tuple[int, ...]) -> int:
    """A hidden state's int8 groups per token (0: not a hidden state, one scale per row)."""
    return int8_token_groups(shape[-1]) if len(shape) == 3 else 0


def _scale_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An int8 tensor's scales: one per row (in a shape that broadcasts over the row's values), or
    a hidden state's one per group of a token, (B, T, groups)."""
    if _token_groups(shape):
        return shape[:2] + (_token_groups(shape),)
    lead = _lead(shape, "int8")
    return shape[:lead] + (1,) * (len(shape) - lead) if lead else (1,)


def quantise(t: torch.Tensor, dtype: str) -> tuple[torch.Tensor, ...]:
    """One float32 tensor as what crosses in ``dtype`` (``int8`` or ``int4``)."""
    if dtype == "int8":
        groups = _token_groups(tuple(t.shape))
        rows = math.prod(t.shape[:2]) * groups if groups else _rows(tuple(t.shape), dtype)[0]
        flat = t.reshape(rows, -1)
        # the same operations, in the same order, as a hidden state's int8 had before images had it
        scale = flat.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
        q = (flat / scale).round().clamp(-127, 127).to(torch.int8)
        return q.reshape(t.shape).contiguous(), scale.reshape(_scale_shape(tuple(t.shape))).contiguous()
    if dtype == "int4":
        rows, length = _rows(tuple(t.shape), dtype)
        groups = -(-length // INT4_GROUP)
        padded = torch.zeros(rows, groups * INT4_GROUP, dtype=torch.float32)
        padded[:, :length] = t.reshape(rows, length)
        grouped = padded.view(rows, groups, INT4_GROUP)
        scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7.0
        q = ((grouped / scale).round().clamp(-7, 7) + 8).to(torch.uint8).view(rows, groups * INT4_GROUP)
        packed = (q[:, 0::2] << 4) | q[:, 1::2]
        return packed.contiguous(), scale.view(rows, groups).contiguous(), torch.tensor(t.shape, dtype=torch.int64)
    raise ValueError(f"not a quantised wire dtype: {dtype!r}")


def decoded_shape(parts: tuple[torch.Tensor, ...], dtype: str) -> tuple[int, ...]:
    """The shape the tensor that crossed as ``parts`` will have, read before anything is allocated
    (an int4 tensor's from its shape part, checked)."""
    if dtype != "int4":
        return tuple(parts[0].shape)
    shape_t = parts[2]
    if shape_t.dtype != torch.int64 or shape_t.dim() != 1 or not 1 <= shape_t.numel() <= _MAX_NDIM \
            or bool((shape_t < 0).any()):
        raise WireError(f"an int4 tensor's shape crosses as 1 to {_MAX_NDIM} non-negative int64: got "
                        f"{_described((shape_t,))}")
    return tuple(int(n) for n in shape_t)


def dequantise(parts: tuple[torch.Tensor, ...], dtype: str) -> torch.Tensor:
    """A float32 tensor from what crossed in ``dtype``; a part that does not fit the others is refused."""
    if dtype == "int8":
        q, scale = parts
        if q.dtype != torch.int8 or scale.dtype != torch.float32 or q.dim() < 1 \
                or tuple(scale.shape) != _scale_shape(tuple(q.shape)):
            raise WireError(f"an int8 tensor crosses with one float32 scale per row: got {_described(parts)}")
        if _token_groups(tuple(q.shape)):
            grouped_q = q.reshape(*scale.shape, -1).to(torch.float32)
            return _finite((grouped_q * scale.unsqueeze(-1)).reshape(q.shape), dtype)
        return _finite(q.to(torch.float32) * scale, dtype)
    packed, scale, _ = parts
    shape = decoded_shape(parts, dtype)
    rows, length = _rows(shape, dtype)
    groups = -(-length // INT4_GROUP)
    if packed.dtype != torch.uint8 or tuple(packed.shape) != (rows, groups * INT4_GROUP // 2) \
            or scale.dtype != torch.float32 or tuple(scale.shape) != (rows, groups):
        raise WireError(f"an int4 tensor of shape {shape} crosses as uint8 {(rows, groups * INT4_GROUP // 2)} with "
                        f"float32 scales {(rows, groups)}: got {_described(parts[:2])}")
    q = torch.stack((packed >> 4, packed & 15), dim=-1).view(rows, groups, INT4_GROUP).to(torch.float32) - 8
    values = (q * scale.unsqueeze(-1)).view(rows, groups * INT4_GROUP)[:, :length]
    return _finite(values.reshape(shape), dtype)


def _finite(t: torch.Tensor, dtype: str) -> torch.Tensor:
    if not bool(torch.isfinite(t).all()):
        raise WireError(f"an {dtype} tensor decodes to NaN or infinity (its scales are not finite)")
    return t


def _described(parts: tuple[torch.Tensor, ...]) -> str:
    return " + ".join(f"{str(p.dtype).removeprefix('torch.')} {tuple(p.shape)}" for p in parts)


def encode_activation(x: Activation, dtype: str) -> Activation:
    """What a stage sends across its cut: each float32 tensor of ``x`` quantised, in order (a cast
    is the frame codec's); anything else as it is."""
    if dtype not in QUANTISED:
        return x
    out: list[torch.Tensor] = []
    for t in live_tensors(x):
        out.extend(quantise(t, dtype) if t.dtype == torch.float32 else (t,))
    return out[0] if len(out) == 1 else tuple(out)


def grouped(x: Activation, dtype: str) -> list[tuple[torch.Tensor, ...]]:
    """A frame's tensors as the parts of each float32 tensor a stage sent in ``dtype``; a frame of
    the wrong dtypes or count is refused."""
    parts, arity = live_tensors(x), len(PART_DTYPES[dtype])
    groups = [tuple(parts[i:i + arity]) for i in range(0, len(parts), arity)]
    if dtype in QUANTISED and any(tuple(p.dtype for p in g) != PART_DTYPES[dtype] for g in groups):
        raise WireError(f"a tensor in {dtype} crosses as {' + '.join(str(d).removeprefix('torch.') for d in PART_DTYPES[dtype])}: "
                        f"got {_described(parts)}")
    return groups


def decode_activation(groups: list[tuple[torch.Tensor, ...]], dtype: str) -> Activation:
    """The float32 tensors a stage sent in ``dtype``, from :func:`grouped`'s parts (their shapes
    checked by the caller against what it expects, with :func:`decoded_shape`)."""
    if dtype not in QUANTISED:
        out = tuple(g[0] for g in groups)
    else:
        out = tuple(dequantise(g, dtype) for g in groups)
    return out[0] if len(out) == 1 else out


def timed(step: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``step(*args)`` and the seconds it took: quantising is part of a frame's encoding, and
    dequantising of its decoding, wherever a frame is encoded or decoded (a stage, a profile)."""
    t0 = time.perf_counter()
    out = step(*args)
    return out, time.perf_counter() - t0


def roundtrip(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """``t`` (float32) as the receiver gets it in ``dtype``: cast there and back, or quantised."""
    if t.dtype != torch.float32 or dtype == "float32":
        return t
    if dtype in QUANTISED:
        return dequantise(quantise(t, dtype), dtype)
    return t.to(CASTS[dtype]).to(torch.float32)
