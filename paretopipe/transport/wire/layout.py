"""The frame layout: the header and descriptor structs, the frame kinds, the dtype and codec
codes, and the parser that checks a header (and the descriptors of a live set) field by field
before anything the peer claims is allocated."""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch

from ...errors import WireError
from ..runconfig import COMPRESSIONS, DEFAULT_MAX_PAYLOAD, WIRE_DTYPE_NAMES

MAGIC = b"PPWF"
VERSION = 2
MAX_NDIM = 8
HEADER = struct.Struct("<4sBBBBBBBxIQQQ8q")
SEQ_OFFSET = struct.calcsize("<4sBBBBBBBxI")  # where the sequence number sits in the header
EXTRA_OFFSET = struct.calcsize("<4sBBBBBBB")  # the byte after ndim: how many further tensors follow
# A further tensor of a live set: dtype, original dtype, codec, shuffle, ndim, bytes on the wire,
# raw bytes, shape.
DESCRIPTOR = struct.Struct("<BBBBBxxxQQ8q")
MAX_TENSORS = 16  # tensors in one frame: a cut's live set (the sweep's --max-live is far below it)
SEQ = struct.Struct("<Q")
NO_SEQ = bytes(SEQ.size)
MAX_META_BYTES = 64 * 1024
TAG_BYTES = 16  # a sealed frame's authentication tag (paretopipe.transport.aead)

# Frame kinds
HELLO, HELLO_OK, TENSOR, RESULT, RECORDS, ERROR, BYE, CHALLENGE, RUN, RUN_OK, SWITCH, PROBE, PROBE_ACK = range(1, 14)
KIND_NAMES = {HELLO: "HELLO", HELLO_OK: "HELLO_OK", TENSOR: "TENSOR", RESULT: "RESULT", RECORDS: "RECORDS",
              ERROR: "ERROR", BYE: "BYE", CHALLENGE: "CHALLENGE", RUN: "RUN", RUN_OK: "RUN_OK", SWITCH: "SWITCH",
              PROBE: "PROBE", PROBE_ACK: "PROBE_ACK"}

NO_TENSOR = 0
DTYPES: dict[int, torch.dtype] = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16,
                                  4: torch.float64, 5: torch.uint8, 6: torch.int8, 7: torch.int16,
                                  8: torch.int32, 9: torch.int64, 10: torch.bool}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
ITEMSIZE = {code: dt.itemsize for code, dt in DTYPES.items()}
CAST_DTYPES = (2, 3)   # what --wire-dtype may cast to
CAST_FROM = 1          # ...and only from float32, so decoding at most doubles the raw bytes
CODECS = {name: code for code, name in enumerate(COMPRESSIONS)}
CODEC_NAMES = {v: k for k, v in CODECS.items()}
# What the codec casts a float32 tensor to (int8 and int4 are quantised before the codec, by the stage).
WIRE_DTYPES = dict(zip(WIRE_DTYPE_NAMES, (None, torch.float16, torch.bfloat16, None, None)))


class Header(NamedTuple):
    kind: int
    dtype: int
    orig_dtype: int
    codec: int
    shuffle: int
    ndim: int
    meta_len: int
    seq: int
    nbytes: int
    raw_nbytes: int
    shape: tuple[int, ...]
    extra: int = 0  # further tensors of a live set, each described after the header

    @property
    def decoded_nbytes(self) -> int:
        """What the decoded tensor occupies (a cast frame decodes to its original dtype)."""
        if self.dtype == NO_TENSOR:
            return 0
        orig = self.orig_dtype or self.dtype
        return self.raw_nbytes // ITEMSIZE[self.dtype] * ITEMSIZE[orig]


def parse_header(data: bytes | bytearray | memoryview, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Header:
    """Validate the fixed header and its shape. Raises :class:`WireError` on any broken rule."""
    if len(data) != HEADER.size:
        raise WireError(f"header is {len(data)} bytes, expected {HEADER.size}")
    (magic, version, kind, dtype, orig, codec, shuffle, ndim, meta_len, seq, nbytes, raw,
     *dims) = HEADER.unpack(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}: the peer does not speak the ParetoPipe wire format")
    if version != VERSION:
        raise WireError(f"wire version {version} not supported (this side speaks {VERSION})")
    if kind not in KIND_NAMES:
        raise WireError(f"unknown frame kind {kind}")
    if meta_len > MAX_META_BYTES:
        raise WireError(f"meta of {meta_len} bytes exceeds the limit of {MAX_META_BYTES}")
    extra = data[EXTRA_OFFSET]
    if extra >= MAX_TENSORS:
        raise WireError(f"a frame of {extra + 1} tensors; the limit is {MAX_TENSORS}")
    if dtype == NO_TENSOR and extra:
        raise WireError("a frame without a tensor declares further tensors")
    return _tensor_fields(kind, dtype, orig, codec, shuffle, ndim, meta_len, seq, nbytes, raw, dims, max_payload,
                          extra)


def _tensor_fields(kind: int, dtype: int, orig: int, codec: int, shuffle: int, ndim: int, meta_len: int, seq: int,
                   nbytes: int, raw: int, dims: list[int], max_payload: int, extra: int = 0) -> Header:
    """The rules one tensor's fields obey, in a header or in a further tensor's descriptor."""
    if dtype != NO_TENSOR and dtype not in DTYPES or orig != NO_TENSOR and orig not in DTYPES:
        raise WireError(f"dtype code {dtype}/{orig} not in the allow-list")
    if orig not in (NO_TENSOR, dtype) and not (dtype in CAST_DTYPES and orig == CAST_FROM):
        raise WireError(f"a {DTYPES[orig]} tensor cannot travel as {DTYPES.get(dtype)}: only float32 "
                        f"tensors are cast, and only to float16 or bfloat16")
    if codec not in CODEC_NAMES:
        raise WireError(f"unknown codec {codec}")
    if ndim > MAX_NDIM:
        raise WireError(f"ndim {ndim} exceeds the limit of {MAX_NDIM}")
    if nbytes > max_payload or raw > max_payload:
        raise WireError(f"payload of {max(nbytes, raw)} bytes exceeds the limit of {max_payload}")
    if dtype == NO_TENSOR and (ndim or nbytes or raw or codec or shuffle or orig):
        raise WireError("a frame without a tensor declares a shape or payload")
    if codec == 0 and (nbytes != raw or shuffle):
        raise WireError(f"uncompressed payload of {nbytes} bytes but raw size {raw}" if nbytes != raw
                        else "an uncompressed payload cannot be shuffled")
    if codec and raw and not nbytes:
        raise WireError(f"a compressed payload of 0 bytes cannot decode to {raw} bytes")
    if codec and shuffle and shuffle != ITEMSIZE[dtype]:
        raise WireError(f"shuffle width {shuffle} does not match the dtype's {ITEMSIZE[dtype]}")
    shape = tuple(dims[:ndim])
    if any(d for d in dims[ndim:]):
        raise WireError(f"shape slots beyond ndim {ndim} are not zero")
    if any(d < 0 for d in shape):
        raise WireError(f"negative dimension in shape {shape}")
    h = Header(kind, dtype, orig, codec, shuffle, ndim, meta_len, seq, nbytes, raw, shape, extra)
    if dtype != NO_TENSOR:
        check_shape(h, max_payload)
    return h


def parse_descriptors(header: Header, data: bytes | bytearray | memoryview,
                      max_payload: int = DEFAULT_MAX_PAYLOAD) -> list[Header]:
    """The live set's further tensors, each validated like the first; the payload cap holds over
    their sum, raw, on the wire and decoded. Returns every tensor's fields, the header's first."""
    if len(data) != header.extra * DESCRIPTOR.size:
        raise WireError(f"descriptors are {len(data)} bytes, expected {header.extra * DESCRIPTOR.size}")
    tensors = [header]
    for i in range(header.extra):
        dtype, orig, codec, shuffle, ndim, nbytes, raw, *dims = DESCRIPTOR.unpack_from(data, i * DESCRIPTOR.size)
        if dtype == NO_TENSOR:
            raise WireError(f"tensor {i + 2} of the frame has no dtype")
        tensors.append(_tensor_fields(header.kind, dtype, orig, codec, shuffle, ndim, 0, header.seq, nbytes, raw,
                                      dims, max_payload))
    for what, total in (("on the wire", sum(t.nbytes for t in tensors)), ("raw", sum(t.raw_nbytes for t in tensors)),
                        ("decoded", sum(t.decoded_nbytes for t in tensors))):
        if total > max_payload:
            raise WireError(f"the frame's {len(tensors)} tensors take {total} bytes {what}, over the limit "
                            f"of {max_payload}")
    return tensors


def check_shape(header: Header, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
    """The shape must account for exactly the raw bytes, and even an empty tensor's dimensions
    must be ones a real tensor of the payload limit could have (no overflowing products)."""
    shape, itemsize = header.shape, ITEMSIZE[header.dtype]
    if math.prod(max(d, 1) for d in shape) * itemsize > max(max_payload, itemsize):
        raise WireError(f"shape {shape} is larger than any tensor of at most {max_payload} bytes")
    expected = math.prod(shape) * itemsize
    if expected != header.raw_nbytes:
        raise WireError(f"shape {shape} of {DTYPES[header.dtype]} needs {expected} bytes, "
                        f"header says {header.raw_nbytes}")
    if header.decoded_nbytes > max_payload:
        raise WireError(f"the decoded tensor would take {header.decoded_nbytes} bytes, over the limit of {max_payload}")
