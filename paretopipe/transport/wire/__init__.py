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

One module per concern: ``layout`` (the structs, kinds and codes, and the header's checks),
``boundedjson`` (a peer's JSON within bounds), ``codecs`` (tensor to payload and back),
``buffers`` (pooled receive buffers and the received :class:`Frame`), ``frames`` (building a
frame to send), ``send`` and ``reader`` (socket I/O). Everything public is here, as
``wire.<name>``.
"""

from ..runconfig import DEFAULT_MAX_PAYLOAD  # the payload cap a stage accepts, named with the run options
from .layout import (BYE, CAST_DTYPES, CAST_FROM, CHALLENGE, CODEC_NAMES, CODECS, DESCRIPTOR, DTYPE_CODES, DTYPES,
    ERROR, EXTRA_OFFSET, HEADER, HELLO, HELLO_OK, ITEMSIZE, KIND_NAMES, MAGIC, MAX_META_BYTES, MAX_NDIM, MAX_TENSORS,
    NO_SEQ, NO_TENSOR, PROBE, PROBE_ACK, RECORDS, RESULT, RUN, RUN_OK, SEQ, SEQ_OFFSET, SWITCH, TAG_BYTES, TENSOR,
    VERSION, WIRE_DTYPES, check_shape, Header, parse_descriptors, parse_header)
from .boundedjson import MAX_JSON_DEPTH, MAX_NUMBER_CHARS, loads_bounded
from .codecs import Codec, compress, decompress, encode_payload, Payload, shuffle_bytes, tensor_bytes, unshuffle_bytes
from .buffers import BufferPool, Frame, ReceiveBuffer
from .frames import encode, encode_seconds, Encoded, frame
from .send import FrameWriter, send_encoded, send_frame
from .reader import expect, FrameReader, recv_exact_into, recv_frame

__all__ = [
    "BYE", "BufferPool", "CAST_DTYPES", "CAST_FROM", "CHALLENGE", "CODECS", "CODEC_NAMES", "Codec",
    "DEFAULT_MAX_PAYLOAD", "DESCRIPTOR", "DTYPES", "DTYPE_CODES", "ERROR", "EXTRA_OFFSET", "Encoded", "Frame",
    "FrameReader", "FrameWriter", "HEADER", "HELLO", "HELLO_OK", "Header", "ITEMSIZE", "KIND_NAMES", "MAGIC",
    "MAX_JSON_DEPTH", "MAX_META_BYTES", "MAX_NDIM", "MAX_NUMBER_CHARS", "MAX_TENSORS", "NO_SEQ", "NO_TENSOR",
    "PROBE", "PROBE_ACK", "Payload", "RECORDS", "RESULT", "RUN", "RUN_OK", "ReceiveBuffer", "SEQ", "SEQ_OFFSET",
    "SWITCH", "TAG_BYTES", "TENSOR", "VERSION", "WIRE_DTYPES", "check_shape", "compress", "decompress", "encode",
    "encode_payload", "encode_seconds", "expect", "frame", "loads_bounded", "parse_descriptors", "parse_header",
    "recv_exact_into", "recv_frame", "send_encoded", "send_frame", "shuffle_bytes", "tensor_bytes",
    "unshuffle_bytes"]
