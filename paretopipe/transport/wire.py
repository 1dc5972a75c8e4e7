"""Binary tensor frames: a fixed, validated header followed by raw (optionally compressed) bytes.

Frame = header (magic, version, kind, dtype, original dtype, codec, shuffle, ndim, meta length,
sequence number, wire payload bytes, raw payload bytes) + shape (ndim x int64) + meta (UTF-8
JSON, at most 64 KiB) + payload. Nothing on the wire is ever unpickled or evaluated. Every rule
is checked before anything the peer claims is allocated; a frame that breaks one raises
:class:`WireError` and the caller closes the connection.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import struct
import time
from typing import Any

import numpy as np
import torch

from ..errors import PeerError, UsageError, WireError

MAGIC = b"PPWF"
VERSION = 1
HEADER = struct.Struct("<4sBBBBBBBxIQQQ")
MAX_NDIM = 8
MAX_HEADER_BYTES = HEADER.size + 8 * MAX_NDIM
MAX_META_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD = 1 << 30  # 1 GiB
MAX_JSON_DEPTH = 16
MAX_NUMBER_CHARS = 40
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")

# Frame kinds
HELLO, HELLO_OK, TENSOR, RESULT, RECORDS, ERROR, BYE = range(1, 8)
KIND_NAMES = {HELLO: "HELLO", HELLO_OK: "HELLO_OK", TENSOR: "TENSOR", RESULT: "RESULT",
              RECORDS: "RECORDS", ERROR: "ERROR", BYE: "BYE"}

NO_TENSOR = 0
DTYPES: dict[int, torch.dtype] = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16,
                                  4: torch.float64, 5: torch.uint8, 6: torch.int8, 7: torch.int16,
                                  8: torch.int32, 9: torch.int64, 10: torch.bool}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
CAST_DTYPES = (2, 3)  # what --wire-dtype may cast floating tensors to
CODECS = {"none": 0, "zstd": 1, "lz4": 2}
CODEC_NAMES = {v: k for k, v in CODECS.items()}
WIRE_DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        raise WireError(f"a JSON number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return kind(text)


def _no_constant(name: str) -> Any:
    raise WireError(f"JSON constant {name} is not allowed")


def loads_bounded(raw: bytes | bytearray) -> Any:
    """JSON from a peer: UTF-8, nested at most 16 deep, numbers of at most 40 characters, no NaN.

    The limits are checked before (depth) and while (numbers) parsing, so a hostile document
    can neither exhaust the recursion limit nor make the parser build a 5000-digit integer."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"not UTF-8: {exc}")
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise WireError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_int=lambda t: _number(t, int), parse_float=lambda t: _number(t, float),
                          parse_constant=_no_constant)
    except WireError:
        raise
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not valid JSON: {str(exc)[:120]}")


@dataclasses.dataclass
class Codec:
    """How a sender encodes tensor payloads. Both choices are recorded with their cost."""

    compression: str = "none"
    level: int = 3
    wire_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.compression not in CODECS:
            raise UsageError(f"unknown compression {self.compression!r}; valid: {', '.join(CODECS)}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise UsageError(f"unknown wire dtype {self.wire_dtype!r}; valid: {', '.join(WIRE_DTYPES)}")


@dataclasses.dataclass
class Frame:
    kind: int
    seq: int
    tensor: torch.Tensor | None
    meta: dict[str, Any]
    raw_nbytes: int = 0
    wire_nbytes: int = 0
    decode_s: float = 0.0


@dataclasses.dataclass
class Encoded:
    """A frame ready to send: buffers for ``sendmsg`` plus what encoding cost."""

    buffers: list
    raw_nbytes: int
    wire_nbytes: int
    encode_s: float

    @property
    def total_nbytes(self) -> int:
        return sum(memoryview(b).nbytes for b in self.buffers)


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _shuffle(raw: memoryview, itemsize: int) -> bytes:
    """Byte-shuffle (all first bytes, then all second bytes, ...): makes floats compressible."""
    if itemsize <= 1:
        return bytes(raw)
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, itemsize).T.tobytes()


def _unshuffle(data: bytes, itemsize: int) -> np.ndarray:
    arr = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        return arr.copy()  # writable, like every tensor we hand out
    return arr.reshape(itemsize, -1).T.copy().reshape(-1)


def _compress(codec: str, data: bytes, level: int) -> bytes:
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=level).compress(data)
    import lz4.block

    return lz4.block.compress(data, mode="fast", acceleration=max(1, level), store_size=False)


def _decompress(codec: str, data: bytes, raw_nbytes: int) -> bytes:
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


@dataclasses.dataclass
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

    @property
    def wire_nbytes(self) -> int:
        return memoryview(self.data).nbytes


def encode_payload(tensor: torch.Tensor | None, codec: Codec | None = None) -> Payload:
    """Cast/compress a tensor per ``codec``; uncompressed data stays a view of the tensor's memory."""
    if tensor is None:
        return Payload()
    codec = codec or Codec()
    t0 = time.perf_counter()
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype not in DTYPE_CODES:
        raise WireError(f"dtype {t.dtype} is not allowed on the wire; allowed: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPE_CODES)}")
    orig_code = DTYPE_CODES[t.dtype]
    target = WIRE_DTYPES[codec.wire_dtype]
    if target is not None and t.is_floating_point() and t.dtype != target:
        t = t.to(target)
    t = t.contiguous()
    if t.dim() > MAX_NDIM:
        raise WireError(f"tensor has {t.dim()} dims; the wire allows at most {MAX_NDIM}")
    raw = _tensor_bytes(t)
    out = Payload(DTYPE_CODES[t.dtype], orig_code, 0, 0, tuple(t.shape), raw, raw.nbytes)
    if codec.compression != "none" and raw.nbytes:
        out.shuffle = t.element_size()
        out.data = _compress(codec.compression, _shuffle(raw, out.shuffle), codec.level)
        out.codec = CODECS[codec.compression]
    out.encode_s = time.perf_counter() - t0
    return out


def frame(kind: int, seq: int, payload: Payload | None = None, meta: dict | None = None) -> Encoded:
    """Header + shape + meta + payload buffers, ready for :func:`send_encoded`."""
    payload = payload or Payload()
    t0 = time.perf_counter()
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
    if len(meta_bytes) > MAX_META_BYTES:
        raise WireError(f"frame meta is {len(meta_bytes)} bytes; the limit is {MAX_META_BYTES}")
    shape = payload.shape
    header = HEADER.pack(MAGIC, VERSION, kind, payload.dtype, payload.orig_dtype, payload.codec,
                         payload.shuffle, len(shape), len(meta_bytes), seq, payload.wire_nbytes,
                         payload.raw_nbytes)
    head = header + struct.pack(f"<{len(shape)}q", *shape) + meta_bytes
    buffers = [head, payload.data] if payload.wire_nbytes else [head]
    return Encoded(buffers, payload.raw_nbytes, payload.wire_nbytes,
                   payload.encode_s + time.perf_counter() - t0)


def encode(kind: int, seq: int, tensor: torch.Tensor | None = None, meta: dict | None = None,
           codec: Codec | None = None) -> Encoded:
    """One frame in one call (see :func:`encode_payload` and :func:`frame`)."""
    return frame(kind, seq, encode_payload(tensor, codec), meta)


def send_encoded(sock: socket.socket, enc: Encoded) -> None:
    """``sendmsg`` the buffers, resuming after partial sends, with no copy of the payload."""
    views = [memoryview(b).cast("B") for b in enc.buffers]
    while views:
        try:
            sent = sock.sendmsg(views)
        except socket.timeout:
            raise PeerError("timed out sending to the peer (it stopped reading)")
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise PeerError(f"peer closed the connection while we were sending ({exc.strerror})")
        while sent and views:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_frame(sock: socket.socket, kind: int, seq: int = 0, tensor: torch.Tensor | None = None,
               meta: dict | None = None, codec: Codec | None = None) -> Encoded:
    enc = encode(kind, seq, tensor, meta, codec)
    send_encoded(sock, enc)
    return enc


def recv_exact_into(sock: socket.socket, view: memoryview, what: str) -> None:
    got = 0
    total = view.nbytes
    while got < total:
        try:
            n = sock.recv_into(view[got:], total - got)
        except socket.timeout:
            raise PeerError(f"timed out waiting for {what} from the peer")
        except ConnectionResetError:
            raise PeerError(f"peer reset the connection while we waited for {what}")
        if n == 0:
            raise PeerError("peer closed the connection" + (f" in the middle of {what}" if got else ""))
        got += n


@dataclasses.dataclass(frozen=True)
class Header:
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


def parse_header(data: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Header:
    """Validate the fixed header. Raises :class:`WireError` on any broken rule."""
    if len(data) != HEADER.size:
        raise WireError(f"header is {len(data)} bytes, expected {HEADER.size}")
    magic, version, kind, dtype, orig, codec, shuffle, ndim, meta_len, seq, nbytes, raw = HEADER.unpack(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}: the peer does not speak the ParetoPipe wire format")
    if version != VERSION:
        raise WireError(f"wire version {version} not supported (this side speaks {VERSION})")
    if kind not in KIND_NAMES:
        raise WireError(f"unknown frame kind {kind}")
    if dtype != NO_TENSOR and dtype not in DTYPES or orig != NO_TENSOR and orig not in DTYPES:
        raise WireError(f"dtype code {dtype}/{orig} not in the allow-list")
    if orig not in (NO_TENSOR, dtype) and not (dtype in CAST_DTYPES and DTYPES[orig].is_floating_point):
        raise WireError(f"a {DTYPES[orig]} tensor cannot travel as {DTYPES.get(dtype)}: only floating "
                        f"tensors are cast, and only to float16 or bfloat16")
    if codec not in CODEC_NAMES:
        raise WireError(f"unknown codec {codec}")
    if ndim > MAX_NDIM:
        raise WireError(f"ndim {ndim} exceeds the limit of {MAX_NDIM}")
    if meta_len > MAX_META_BYTES:
        raise WireError(f"meta of {meta_len} bytes exceeds the limit of {MAX_META_BYTES}")
    if nbytes > max_payload or raw > max_payload:
        raise WireError(f"payload of {max(nbytes, raw)} bytes exceeds the limit of {max_payload}")
    if dtype == NO_TENSOR and (ndim or nbytes or raw or codec):
        raise WireError("a frame without a tensor declares a shape or payload")
    if codec == 0 and nbytes != raw:
        raise WireError(f"uncompressed payload of {nbytes} bytes but raw size {raw}")
    if codec and shuffle and shuffle != DTYPES[dtype].itemsize:
        raise WireError(f"shuffle width {shuffle} does not match the dtype's {DTYPES[dtype].itemsize}")
    return Header(kind, dtype, orig, codec, shuffle, ndim, meta_len, seq, nbytes, raw)


def check_shape(header: Header, shape: tuple[int, ...]) -> None:
    if any(d < 0 for d in shape):
        raise WireError(f"negative dimension in shape {shape}")
    count = 1
    for d in shape:
        count *= d
    expected = count * DTYPES[header.dtype].itemsize
    if expected != header.raw_nbytes:
        raise WireError(f"shape {shape} of {DTYPES[header.dtype]} needs {expected} bytes, "
                        f"header says {header.raw_nbytes}")


def recv_frame(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """Read and validate one frame; the payload lands in a buffer allocated after validation."""
    head = bytearray(HEADER.size)
    recv_exact_into(sock, memoryview(head), "a frame header")
    h = parse_header(bytes(head), max_payload)
    shape: tuple[int, ...] = ()
    if h.ndim:
        raw_shape = bytearray(8 * h.ndim)
        recv_exact_into(sock, memoryview(raw_shape), "a frame shape")
        shape = struct.unpack(f"<{h.ndim}q", raw_shape)
    if h.dtype != NO_TENSOR:
        check_shape(h, shape)
    meta: dict[str, Any] = {}
    if h.meta_len:
        raw_meta = bytearray(h.meta_len)
        recv_exact_into(sock, memoryview(raw_meta), "frame meta")
        try:
            meta = loads_bounded(raw_meta)
        except WireError as exc:
            raise WireError(f"frame meta: {exc}")
        if not isinstance(meta, dict):
            raise WireError("frame meta must be a JSON object")
    tensor = None
    decode_s = 0.0
    if h.dtype != NO_TENSOR:
        if h.codec == 0:
            buf = torch.empty(h.raw_nbytes, dtype=torch.uint8)
            if h.raw_nbytes:
                recv_exact_into(sock, memoryview(buf.numpy()).cast("B"), "a tensor payload")
            t0 = time.perf_counter()
        else:
            packed = bytearray(h.nbytes)
            recv_exact_into(sock, memoryview(packed), "a compressed payload")
            t0 = time.perf_counter()
            raw = _decompress(CODEC_NAMES[h.codec], bytes(packed), h.raw_nbytes)
            buf = torch.from_numpy(_unshuffle(raw, h.shuffle))
        tensor = buf.view(DTYPES[h.dtype]).reshape(shape) if h.raw_nbytes else \
            torch.empty(shape, dtype=DTYPES[h.dtype])
        orig = DTYPES.get(h.orig_dtype, DTYPES[h.dtype])
        if orig != tensor.dtype:
            tensor = tensor.to(orig)
        decode_s = time.perf_counter() - t0
    return Frame(h.kind, h.seq, tensor, meta, h.raw_nbytes, h.nbytes, decode_s)


def expect(frame: Frame, *kinds: int) -> Frame:
    """Raise a clear error for an unexpected frame kind (an ERROR frame carries the peer's reason)."""
    if frame.kind in kinds:
        return frame
    if frame.kind == ERROR:
        raise PeerError(f"peer reported: {frame.meta.get('reason', 'unknown error')}")
    wanted = "/".join(KIND_NAMES[k] for k in kinds)
    raise WireError(f"expected a {wanted} frame, got {KIND_NAMES.get(frame.kind, frame.kind)}")
