"""Binary tensor frames: a fixed, validated header followed by raw (optionally compressed) bytes.

Frame = header (104 bytes: magic, version, kind, dtype, original dtype, codec, shuffle, ndim,
the number of further tensors, meta length, sequence number, wire payload bytes, raw payload bytes,
and the shape as 8 int64 slots) + one 88-byte descriptor per further tensor (the same fields) +
meta (UTF-8 JSON, at most 64 KiB) + the payloads, in order. A frame with further tensors carries
the live set of a cut where several tensors cross (a skip connection, a detector's feature
pyramid); each tensor is validated on its own and the payload cap holds over their sum. On a
sealed connection the descriptors travel in the clear beside the header and are authenticated
with it. The header and shape arrive in one read;
meta and payload in one scatter read. Nothing on the wire is ever unpickled or evaluated. Every
rule is checked before anything the peer claims is allocated; a frame that breaks one raises
:class:`WireError` and the caller closes the connection.

Receive buffers can come from a :class:`BufferPool`: a run sends one payload size per direction,
so after the first frame no buffer is allocated or page-faulted again. A frame whose tensor lives
in a pooled buffer must be :meth:`Frame.release`\\ d by its consumer once the tensor is no longer
used; without a pool, tensors are ordinary allocations with no obligation.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import math
import re
import socket
import struct
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import PeerError, UsageError, WireError
from .runconfig import COMPRESSIONS, DEFAULT_MAX_PAYLOAD, WIRE_DTYPE_NAMES

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
_SEQ = struct.Struct("<Q")
_NO_SEQ = bytes(_SEQ.size)
MAX_META_BYTES = 64 * 1024
TAG_BYTES = 16  # a sealed frame's authentication tag (paretopipe.transport.aead)
MAX_JSON_DEPTH = 16
MAX_NUMBER_CHARS = 40
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")

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
WIRE_DTYPES = dict(zip(WIRE_DTYPE_NAMES, (None, torch.float16, torch.bfloat16)))


def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        raise WireError(f"a JSON number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    return kind(text)


def _no_constant(name: str) -> Any:
    raise WireError(f"JSON constant {name} is not allowed")


def loads_bounded(raw: bytes | bytearray | memoryview) -> Any:
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

    @property
    def is_plain(self) -> bool:
        """Tensors go out as they are: no compression, no cast."""
        return self.compression == "none" and self.wire_dtype == "float32"

    def __post_init__(self) -> None:
        if self.compression not in CODECS:
            raise UsageError(f"unknown compression {self.compression!r}; valid: {', '.join(CODECS)}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise UsageError(f"unknown wire dtype {self.wire_dtype!r}; valid: {', '.join(WIRE_DTYPES)}")


class _Buffer:
    """A receive buffer: the tensor, its byte view for ``recv_into``, and the typed views handed
    out before (a run receives one dtype and shape per direction, so they are made once)."""

    __slots__ = ("tensor", "view", "typed")

    def __init__(self, nbytes: int) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        self.view = memoryview(self.tensor.numpy()).cast("B")
        self.typed: dict[tuple, torch.Tensor] = {}

    def as_tensor(self, dtype: torch.dtype, shape: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        key = (dtype, shape, offset)
        t = self.typed.get(key)
        if t is None:
            # A sealed frame's buffer holds its tag after the payload; a live set's tensors lie one
            # after another.
            nbytes = math.prod(shape) * dtype.itemsize
            whole = self.tensor if nbytes == self.tensor.numel() else self.tensor[offset:offset + nbytes]
            t = self.typed[key] = whole.view(dtype).reshape(shape)
        return t


class BufferPool:
    """Receive buffers reused frame after frame. ``take`` hands one out; whoever holds the frame
    gives it back with :meth:`Frame.release`. At most ``max_bytes`` are kept idle."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[_Buffer]] = {}
        self._idle = 0
        self._lock = threading.Lock()
        self.allocated = 0  # how many buffers had to be allocated (benchmarks and tests read it)

    def take(self, nbytes: int) -> _Buffer:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._idle -= nbytes
                return free.pop()
            self.allocated += 1
        return _Buffer(nbytes)

    def give(self, buf: _Buffer) -> None:
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
    _buffer: _Buffer | None = None
    _pool: BufferPool | None = None

    def release(self) -> None:
        """Give a pooled receive buffer back; the tensor must not be used afterwards."""
        if self._buffer is not None and self._pool is not None:
            self._pool.give(self._buffer)
        self._buffer = self._pool = None
        self.tensor = None


@dataclasses.dataclass(slots=True)
class Encoded:
    """A frame ready to send: buffers for ``sendmsg`` plus what encoding cost."""

    buffers: list
    raw_nbytes: int
    wire_nbytes: int
    encode_s: float
    total_nbytes: int = 0  # header + meta + payload, as sent
    seal_s: float = 0.0    # sealing it, on a sealed connection (set when it is sent)
    clear_nbytes: int = HEADER.size  # what a sealed frame sends in the clear: header and descriptors


def _tensor_bytes(t: torch.Tensor) -> memoryview:
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


def _decompress(codec: str, data: Any, raw_nbytes: int) -> bytes:
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
    raw = _tensor_bytes(t)
    out = Payload(DTYPE_CODES[t.dtype], orig_code, 0, 0, tuple(t.shape), raw, raw.nbytes, 0.0, raw.nbytes)
    if codec is not None and codec.compression != "none" and raw.nbytes:
        out.shuffle = t.element_size()
        out.data = _compress(codec.compression, _shuffle(raw, out.shuffle), codec.level)
        out.wire_nbytes = len(out.data)
        out.codec = CODECS[codec.compression]
    out.encode_s = time.perf_counter() - t0
    return out


_NO_SHAPE = (0,) * MAX_NDIM


def frame(kind: int, seq: int, payload: Payload | list[Payload] | None = None, meta: dict | None = None) -> Encoded:
    """Header (with the shape) + meta + payload buffers, ready for :func:`send_encoded`; a list of
    payloads is a live set, one frame with a descriptor for each tensor after the first."""
    t0 = time.perf_counter()
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
    if len(meta_bytes) > MAX_META_BYTES:
        raise WireError(f"frame meta is {len(meta_bytes)} bytes; the limit is {MAX_META_BYTES}")
    if isinstance(payload, list):
        return _frame_live_set(kind, seq, payload, meta_bytes, t0)
    if payload is None or payload.dtype == NO_TENSOR:
        header = HEADER.pack(MAGIC, VERSION, kind, 0, 0, 0, 0, 0, len(meta_bytes), seq, 0, 0, *_NO_SHAPE)
        return Encoded([header + meta_bytes], 0, 0, time.perf_counter() - t0, HEADER.size + len(meta_bytes))
    shape, wire_nbytes = payload.shape, payload.wire_nbytes
    header = HEADER.pack(MAGIC, VERSION, kind, payload.dtype, payload.orig_dtype, payload.codec, payload.shuffle,
                         len(shape), len(meta_bytes), seq, wire_nbytes, payload.raw_nbytes,
                         *shape, *_NO_SHAPE[len(shape):])
    head = header + meta_bytes if meta_bytes else header
    buffers = [head, payload.data] if wire_nbytes else [head]
    return Encoded(buffers, payload.raw_nbytes, wire_nbytes, payload.encode_s + time.perf_counter() - t0,
                   len(head) + wire_nbytes)


def _frame_live_set(kind: int, seq: int, payloads: list[Payload], meta_bytes: bytes, t0: float) -> Encoded:
    if not 2 <= len(payloads) <= MAX_TENSORS:
        raise WireError(f"a frame carries 2 to {MAX_TENSORS} tensors of a live set, not {len(payloads)}")
    first, rest = payloads[0], payloads[1:]
    header = bytearray(HEADER.pack(MAGIC, VERSION, kind, first.dtype, first.orig_dtype, first.codec, first.shuffle,
                                   len(first.shape), len(meta_bytes), seq, first.wire_nbytes, first.raw_nbytes,
                                   *first.shape, *_NO_SHAPE[len(first.shape):]))
    header[EXTRA_OFFSET] = len(rest)
    descriptors = b"".join(DESCRIPTOR.pack(p.dtype, p.orig_dtype, p.codec, p.shuffle, len(p.shape), p.wire_nbytes,
                                           p.raw_nbytes, *p.shape, *_NO_SHAPE[len(p.shape):]) for p in rest)
    head = bytes(header) + descriptors + meta_bytes
    buffers = [head] + [p.data for p in payloads if p.wire_nbytes]
    wire_nbytes = sum(p.wire_nbytes for p in payloads)
    return Encoded(buffers, sum(p.raw_nbytes for p in payloads), wire_nbytes,
                   sum(p.encode_s for p in payloads) + time.perf_counter() - t0, len(head) + wire_nbytes,
                   clear_nbytes=HEADER.size + len(descriptors))


def encode_seconds(payload: Payload | list[Payload]) -> float:
    """What encoding one payload, or every payload of a live set, took."""
    return sum(p.encode_s for p in payload) if isinstance(payload, list) else payload.encode_s


_PLAIN: dict[tuple, tuple[bytes, type, int]] = {}  # (kind, dtype, shape) -> header, array type, bytes


def _plain_header(kind: int, t: torch.Tensor) -> tuple[bytes, type, int] | None:
    """A shape's header, packed and validated once by the general path, with the payload's array
    type and size; None for what the general path must handle (an empty tensor)."""
    payload = encode_payload(t)
    nbytes = payload.wire_nbytes
    if not nbytes:
        return None
    if len(_PLAIN) >= 256:  # a run sends a handful of shapes; a sweep of cuts a few more
        _PLAIN.clear()
    known = _PLAIN[(kind, t.dtype, t.shape)] = (frame(kind, 0, payload).buffers[0], ctypes.c_ubyte * nbytes, nbytes)
    return known


_now = time.perf_counter
_pack_seq = _SEQ.pack_into
# (kind, dtypes and shapes) -> header with descriptors, payload array types, payload bytes
_PLAIN_LIVE: dict[tuple, tuple[bytes, list[type], int]] = {}


def _encode_plain_live_set(kind: int, seq: int, tensors: tuple[torch.Tensor, ...], t0: float) -> Encoded | None:
    """A live set sent as it is, the way :func:`encode` sends one tensor: the header and descriptors
    packed and validated once per shape, the payloads laid over the tensors' memory. None for what
    the general path must handle (a tensor elsewhere, strided, lazily negated or empty)."""
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous()) or t.is_neg() or not t.numel():
            return None
    key = (kind, tuple((t.dtype, t.shape) for t in tensors))
    known = _PLAIN_LIVE.get(key)
    if known is None:
        enc = frame(kind, 0, encode_payload(tensors), None)  # checks each dtype and rank
        if len(_PLAIN_LIVE) >= 256:
            _PLAIN_LIVE.clear()
        known = _PLAIN_LIVE[key] = (bytes(enc.buffers[0]), [ctypes.c_ubyte * (t.numel() * t.element_size())
                                                            for t in tensors], enc.wire_nbytes)
    head, array_types, nbytes = known
    header = bytearray(head)
    _pack_seq(header, SEQ_OFFSET, seq)
    buffers: list = [header]
    for t, array_type in zip(tensors, array_types):
        data = array_type.from_address(t.data_ptr())
        data.owner = t  # each array keeps its tensor's memory alive while the frame is queued
        buffers.append(data)
    return Encoded(buffers, nbytes, nbytes, _now() - t0, len(head) + nbytes, clear_nbytes=len(head))


def encode(kind: int, seq: int, tensor: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
           meta: dict | None = None, codec: Codec | None = None) -> Encoded:
    """One frame in one call (see :func:`encode_payload` and :func:`frame`).

    The stages' hot path is inline: a CPU tensor sent as it is, with no meta. A run sends one
    shape per direction, so its header comes from :func:`_plain_header` and only the sequence
    number is patched in; the payload is a ctypes array over the tensor's memory. Every touch
    counts: between two 0.1 MB sends the caches are cold, and the general path's 1.7 us (hot)
    became 5.5 us a frame there, 12% of loopback goodput."""
    t0 = _now()
    if isinstance(tensor, tuple):  # a live set: each tensor is cast and compressed on its own
        if (codec is None or codec.is_plain) and not meta:
            enc = _encode_plain_live_set(kind, seq, tensor, t0)
            if enc is not None:
                return enc
        return frame(kind, seq, encode_payload(tensor, codec), meta)
    if tensor is not None and (codec is None or codec.is_plain) and not meta \
            and tensor.is_cpu and tensor.is_contiguous() and not tensor.is_neg():
        known = _PLAIN.get((kind, tensor.dtype, tensor.shape)) or _plain_header(kind, tensor)
        if known is not None:
            head, array_type, nbytes = known
            header = bytearray(head)
            _pack_seq(header, SEQ_OFFSET, seq)
            data = array_type.from_address(tensor.data_ptr())
            data.owner = tensor  # the array keeps the tensor's memory alive while the frame is queued
            return Encoded([header, data], nbytes, nbytes, _now() - t0, HEADER.size + nbytes)
    return frame(kind, seq, encode_payload(tensor, codec), meta)


def send_encoded(sock: socket.socket, enc: Encoded) -> None:
    """``sendmsg`` the buffers, resuming after partial sends, with no copy of the payload."""
    try:
        sent = sock.sendmsg(enc.buffers)
        if sent != enc.total_nbytes:
            _send_rest(sock, enc, sent)
    except socket.timeout:
        raise PeerError("timed out sending to the peer (it stopped reading)")
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise PeerError(f"peer closed the connection while we were sending ({exc.strerror})")


def _send_rest(sock: socket.socket, enc: Encoded, sent: int) -> None:
    """After a partial send (a timeout-mode socket, a signal): the views that are left."""
    views = [memoryview(b).cast("B") for b in enc.buffers]
    while views:
        while sent and views:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
        if views:
            sent = sock.sendmsg(views)


class FrameWriter:
    """Sends the frames of one connection, each with one ``sendmsg`` straight from the tensor's
    memory. Copying header and payload into one buffer first (as this writer did up to 1 MB) cost
    more than it saved: 0.86 against 0.95 of raw ``sendall`` at 0.1 MB, and 0.83 against 0.93 at
    1 MB, on loopback (benchmarks/transport.py).

    With ``sealer`` (:class:`paretopipe.transport.aead.Direction`) every frame's body is sealed
    under its header as it is sent, and :attr:`Encoded.seal_s` says what that cost. Sealing and
    sending hold one lock, so the frame counter follows the order on the wire whichever thread
    sends."""

    def __init__(self, sock: socket.socket, sealer: Any = None) -> None:
        self.sock, self.sealer = sock, sealer
        self.overhead = 0 if sealer is None else TAG_BYTES  # bytes a frame gains on the wire
        self.send = functools.partial(send_encoded, sock) if sealer is None else self._send_sealed

    def _send_sealed(self, enc: Encoded) -> None:
        head, clear = enc.buffers[0], enc.clear_nbytes
        header = head[:clear] if len(head) > clear else head
        parts = ([memoryview(head)[clear:]] if len(head) > clear else []) + list(enc.buffers[1:])
        body = parts[0] if len(parts) == 1 else b"".join(parts)  # meta and payload together: control frames
        with self.sealer.lock:
            sealed = self.sealer.seal(header, body)
            enc.seal_s = self.sealer.last_s
            send_encoded(self.sock, Encoded([header, sealed], enc.raw_nbytes, enc.wire_nbytes, enc.encode_s,
                                            len(header) + sealed.nbytes))


def send_frame(sock: socket.socket, kind: int, seq: int = 0, tensor: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
               meta: dict | None = None, codec: Codec | None = None) -> Encoded:
    enc = encode(kind, seq, tensor, meta, codec)
    send_encoded(sock, enc)
    return enc


def _wait(sock: socket.socket, deadline: float | None, what: str) -> None:
    if deadline is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"timed out waiting for {what}: the peer missed its deadline")
        sock.settimeout(remaining)


def recv_exact_into(sock: socket.socket, view: memoryview, what: str, deadline: float | None = None) -> None:
    got = 0
    total = view.nbytes
    while got < total:
        _wait(sock, deadline, what)
        try:
            n = sock.recv_into(view[got:], total - got)
        except socket.timeout:
            raise PeerError(f"timed out waiting for {what} from the peer")
        except ConnectionResetError:
            raise PeerError(f"peer reset the connection while we waited for {what}")
        if n == 0:
            raise PeerError("peer closed the connection" + (f" in the middle of {what}" if got else ""))
        got += n


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


_BULK_BYTES = 256 << 10
_TAIL_BYTES = 64 << 10


class FrameReader:
    """Reads the frames of one connection. With ``read_ahead``, each body read also asks for the
    next frame's header, so back-to-back frames cost one system call each instead of two; the
    reader then owns the connection's incoming bytes and must be the only one reading them."""

    def __init__(self, sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 pool: BufferPool | None = None, read_ahead: bool = True, opener: Any = None) -> None:
        self.sock, self.max_payload, self.pool = sock, max_payload, pool
        self.opener = opener  # an aead.Direction: every frame's body is sealed under its header
        self.read_ahead = read_ahead and hasattr(sock, "recvmsg_into")
        self._head = bytearray(HEADER.size)
        self._view = memoryview(self._head)
        self._have = 0  # bytes of the next header already read ahead
        # The last header that passed validation, with its sequence number zeroed: a run's frames
        # differ only in that number, and validation never looks at it, so an identical header
        # needs no second check (parse_header costs 3 us, a tenth of a 0.1 MB frame on loopback).
        self._valid_raw = b""
        self._valid: Header | None = None
        self._valid_live: tuple[Header, bytes, list[Header]] | None = None  # the same, for a live set's descriptors

    def _header(self) -> tuple[Header, int]:
        head = self._head
        (seq,) = _SEQ.unpack_from(head, SEQ_OFFSET)
        self._view[SEQ_OFFSET:SEQ_OFFSET + _SEQ.size] = _NO_SEQ
        if self._valid is None or head != self._valid_raw:
            self._valid = parse_header(head, self.max_payload)
            self._valid_raw = bytes(head)
        return self._valid, seq

    def _body(self, views: list[memoryview], deadline: float | None) -> None:
        views = [v for v in views if v.nbytes]
        if not self.read_ahead:
            for v in views:
                recv_exact_into(self.sock, v, "a frame body", deadline)
            return
        ahead = self._view
        started = False
        while views:
            _wait(self.sock, deadline, "a frame body")
            try:
                if deadline is None and len(views) == 1 and views[0].nbytes > _BULK_BYTES:
                    # A large payload arrives in many pieces; one MSG_WAITALL call takes all but its
                    # tail without a trip through Python per piece (3 us each, about 10% of
                    # goodput at 1 MB). The tail still reads ahead into the next header.
                    n = self.sock.recv_into(views[0][:-_TAIL_BYTES], 0, socket.MSG_WAITALL)
                else:
                    n = self.sock.recvmsg_into(views + [ahead])[0]
            except socket.timeout:
                raise PeerError("timed out waiting for a frame body from the peer")
            except ConnectionResetError:
                raise PeerError("peer reset the connection while we waited for a frame body")
            if n == 0:
                raise PeerError("peer closed the connection" + (" in the middle of a frame body" if started else ""))
            started = True
            while n and views:
                if n >= views[0].nbytes:
                    n -= views[0].nbytes
                    views.pop(0)
                else:
                    views[0] = views[0][n:]
                    n = 0
            self._have = n  # what spilled over belongs to the next header

    def read(self, deadline: float | None = None) -> Frame:
        """The next frame, validated before anything it claims is allocated; ``deadline``
        (monotonic) bounds the whole frame, however slowly the peer sends it."""
        if self._have < HEADER.size:
            recv_exact_into(self.sock, self._view[self._have:], "a frame header", deadline)
        self._have = 0
        aad = bytes(self._head) if self.opener is not None else b""  # before the sequence number is zeroed
        h, seq = self._header()
        if h.extra:
            return self._read_live_set(h, seq, aad, deadline)
        pool = self.pool
        buf = None
        open_s = 0.0
        payload = h.nbytes if h.dtype != NO_TENSOR else 0
        if self.opener is not None:
            meta_buf, buf = self._sealed_body(h.meta_len, payload, aad, deadline)
            open_s = self.opener.last_s
        else:
            meta_buf = bytearray(h.meta_len)
            if payload:
                buf = pool.take(payload) if pool is not None else _Buffer(payload)
                self._body([memoryview(meta_buf), buf.view] if h.meta_len else [buf.view], deadline)
            elif h.meta_len:
                self._body([memoryview(meta_buf)], deadline)
        meta = _frame_meta(meta_buf, h.meta_len)
        if h.dtype == NO_TENSOR:
            return Frame(h.kind, seq, None, meta, open_s=open_s)
        t0 = time.perf_counter()
        tensor, is_view = _decode(h, buf, 0)
        keep = _kept(buf, is_view, pool)
        return Frame(h.kind, seq, tensor, meta, h.raw_nbytes, h.nbytes, time.perf_counter() - t0, open_s, keep,
                     pool if keep is not None else None)

    def _read_live_set(self, h: Header, seq: int, aad: bytes, deadline: float | None) -> Frame:
        """A frame of several tensors: their descriptors first (exactly, so that nothing of the body
        is read ahead into the next header's place), then meta and payloads in one read."""
        described = bytearray(h.extra * DESCRIPTOR.size)
        recv_exact_into(self.sock, memoryview(described), "a frame's tensor descriptors", deadline)
        valid = self._valid_live
        if valid is not None and valid[0] == h and valid[1] == described:
            tensors = valid[2]
        else:
            tensors = parse_descriptors(h, described, self.max_payload)
            self._valid_live = (h, bytes(described), tensors)
        pool, payload, open_s = self.pool, sum(t.nbytes for t in tensors), 0.0
        if self.opener is not None:
            meta_buf, buf = self._sealed_body(h.meta_len, payload, aad + bytes(described), deadline)
            open_s = self.opener.last_s
        else:
            meta_buf = bytearray(h.meta_len)
            buf = (pool.take(payload) if pool is not None else _Buffer(payload)) if payload else None
            self._body([memoryview(meta_buf)] + ([buf.view] if buf is not None else []), deadline)
        meta = _frame_meta(meta_buf, h.meta_len)
        t0 = time.perf_counter()
        decoded, offset, any_view = [], 0, False
        for t in tensors:
            tensor, is_view = _decode(t, buf, offset)
            decoded.append(tensor)
            any_view |= is_view
            offset += t.nbytes
        keep = _kept(buf, any_view, pool)
        return Frame(h.kind, seq, tuple(decoded), meta, sum(t.raw_nbytes for t in tensors), payload,
                     time.perf_counter() - t0, open_s, keep, pool if keep is not None else None)

    def _sealed_body(self, meta_len: int, payload: int, aad: bytes, deadline: float | None
                     ) -> tuple[Any, _Buffer | None]:
        """Read a sealed body and its tag, open it in place: (meta bytes, payload buffer or None).
        The payload's buffer holds the tag after it, so the common frame (a tensor, no meta) is
        read and opened where the tensor will live, with no copy."""
        if payload and not meta_len:
            buf = self.pool.take(payload + TAG_BYTES) if self.pool is not None else _Buffer(payload + TAG_BYTES)
            self._body([buf.view], deadline)
            self.opener.open_in_place(aad, buf.view)
            return b"", buf
        sealed = bytearray(meta_len + payload + TAG_BYTES)
        view = memoryview(sealed)
        self._body([view], deadline)
        self.opener.open_in_place(aad, view)
        if not payload:
            return view[:meta_len], None
        buf = self.pool.take(payload) if self.pool is not None else _Buffer(payload)
        buf.view[:payload] = view[meta_len:meta_len + payload]
        return view[:meta_len], buf


def _kept(buf: _Buffer | None, viewed: bool, pool: BufferPool | None) -> _Buffer | None:
    """The pooled buffer a frame's tensors still view (the frame's consumer releases it), else
    nothing: a buffer no tensor views goes back to the pool now."""
    if buf is None or pool is None:
        return None
    if viewed:
        return buf
    pool.give(buf)
    return None


def _frame_meta(meta_buf: Any, meta_len: int) -> dict[str, Any]:
    if not meta_len:
        return {}
    try:
        meta = loads_bounded(meta_buf)
    except WireError as exc:
        raise WireError(f"frame meta: {exc}")
    if not isinstance(meta, dict):
        raise WireError("frame meta must be a JSON object")
    return meta


def _decode(h: Header, buf: _Buffer | None, offset: int) -> tuple[torch.Tensor, bool]:
    """One tensor from its validated fields and its bytes at ``offset`` of ``buf``; True when the
    tensor is a view of the buffer (which must then outlive it)."""
    dtype = DTYPES[h.dtype]
    if not h.raw_nbytes:
        tensor, is_view = torch.zeros(h.shape, dtype=dtype), False
    elif h.codec == 0:
        tensor, is_view = buf.as_tensor(dtype, h.shape, offset), True
    else:
        raw = _decompress(CODEC_NAMES[h.codec], buf.view[offset:offset + h.nbytes], h.raw_nbytes)
        tensor, is_view = torch.from_numpy(_unshuffle(raw, h.shuffle)).view(dtype).reshape(h.shape), False
    if h.orig_dtype not in (NO_TENSOR, h.dtype):
        tensor, is_view = tensor.to(DTYPES[h.orig_dtype]), False
    return tensor, is_view


def recv_frame(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD, pool: BufferPool | None = None,
               deadline: float | None = None) -> Frame:
    """Read one frame (no read-ahead: the caller may hand the socket to someone else afterwards)."""
    return FrameReader(sock, max_payload, pool, read_ahead=False).read(deadline)


def expect(frame: Frame, *kinds: int) -> Frame:
    """Raise a clear error for an unexpected frame kind (an ERROR frame carries the peer's reason)."""
    if frame.kind in kinds:
        return frame
    if frame.kind == ERROR:
        reason = frame.meta.get("reason", "unknown error")
        raise PeerError(f"peer reported: {str(reason)[:300]}")
    wanted = "/".join(KIND_NAMES[k] for k in kinds)
    raise WireError(f"expected a {wanted} frame, got {KIND_NAMES.get(frame.kind, frame.kind)}")
