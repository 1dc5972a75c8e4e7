"""The layout's checks (transport.wire.layout): a lying header, shape, meta or descriptor is a
WireError, and the payload cap holds over a live set's sum."""

from __future__ import annotations

import struct

import pytest
import torch

from paretopipe.transport import wire
from paretopipe.errors import WireError
from wire_helpers import FakeSocket, packed_header, live_frame


@pytest.mark.parametrize("over,match", [
    ({"magic": b"HTTP"}, "bad magic"),
    ({"version": 9}, "wire version 9"),
    ({"kind": 99}, "unknown frame kind"),
    ({"dtype": 77}, "allow-list"),
    ({"codec": 7}, "unknown codec"),
    ({"ndim": 9}, "ndim 9 exceeds"),
    ({"ndim": 0}, "shape slots beyond ndim 0 are not zero"),
    ({"meta_len": 10**6}, "meta of 1000000 bytes exceeds"),
    ({"nbytes": 2**40, "raw": 2**40}, "exceeds the limit"),
    ({"nbytes": 8}, "uncompressed payload of 8 bytes but raw size 16"),
    ({"dtype": 1, "orig": 2}, "torch.float16 tensor cannot travel as torch.float32"),
    ({"dtype": 2, "orig": 9}, "torch.int64 tensor cannot travel as torch.float16"),
    ({"dtype": 2, "orig": 4}, "torch.float64 tensor cannot travel as torch.float16"),
    ({"shuffle": 4}, "uncompressed payload cannot be shuffled"),
    ({"codec": 1, "nbytes": 0}, "compressed payload of 0 bytes cannot decode to 16 bytes"),  # found by the fuzzer
])
def test_lying_headers_are_rejected(over, match):
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(packed_header(**over) + bytes(16)))


def test_shape_must_match_byte_count():
    with pytest.raises(WireError, match=r"shape \(5,\) .* needs 20 bytes, header says 16"):
        wire.recv_frame(FakeSocket(packed_header(shape=(5,)) + bytes(16)))
    with pytest.raises(WireError, match="negative dimension"):
        wire.recv_frame(FakeSocket(packed_header(shape=(-2, -2)) + bytes(16)))


def test_overflowing_empty_shapes_are_refused():
    """The attack that killed the listener: float32 (2^62, 2^62, 0) with 0 payload bytes."""
    with pytest.raises(WireError, match="larger than any tensor"):
        wire.recv_frame(FakeSocket(packed_header(shape=(2**62, 2**62, 0), nbytes=0, raw=0)))
    f = wire.recv_frame(FakeSocket(packed_header(shape=(3, 0, 7), nbytes=0, raw=0)))  # an honest empty tensor
    assert tuple(f.tensor.shape) == (3, 0, 7)


@pytest.mark.parametrize("meta, match", [
    (b"[" * 60000, "nested deeper than 16"),
    (b'{"n": ' + b"9" * 5000 + b"}", "JSON number of 5000 characters"),
    (b'{"x": NaN}', "constant NaN"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_hostile_meta_is_a_wire_error(meta, match):
    head = packed_header(shape=(), kind=wire.HELLO, dtype=0, orig=0, nbytes=0, raw=0, meta_len=len(meta))
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(head + meta))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.__setitem__(wire.HEADER.size, 99), "not in the allow-list"),
    (lambda d: d.__setitem__(wire.HEADER.size, 0), "has no dtype"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24, 3), "needs .* bytes"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24, -1), "negative dimension"),
    (lambda d: struct.pack_into("<q", d, wire.HEADER.size + 24 + 8 * 7, 5), "beyond ndim"),
    (lambda d: struct.pack_into("<QQ", d, wire.HEADER.size + 8, 8, 4), "uncompressed payload of 8 bytes"),
    (lambda d: d.__setitem__(wire.HEADER.size + 4, 9), "exceeds the limit of 8"),
])
def test_a_lying_descriptor_is_refused(edit, match):
    data = live_frame((torch.ones(4), torch.ones(2)), descriptor_edit=edit)
    with pytest.raises(WireError, match=match):
        wire.recv_frame(FakeSocket(data))


def test_the_payload_cap_holds_over_the_sum_of_a_live_sets_tensors():
    tensors = (torch.ones(500), torch.ones(500), torch.ones(500))  # 2000 bytes each, 6000 together
    data = live_frame(tensors)
    assert len(wire.recv_frame(FakeSocket(data), max_payload=6000).tensor) == 3
    with pytest.raises(WireError, match="3 tensors take 6000 bytes .* over the limit of 4096"):
        wire.recv_frame(FakeSocket(data), max_payload=4096)


def test_too_many_tensors_or_further_tensors_without_a_first_are_refused():
    with pytest.raises(WireError, match="a frame of 17 tensors; the limit is 16"):
        wire.recv_frame(FakeSocket(live_frame((torch.ones(1), torch.ones(1)), extra_override=16)))
    empty = bytearray(wire.encode(wire.BYE, 0).buffers[0])
    empty[wire.EXTRA_OFFSET] = 1
    with pytest.raises(WireError, match="without a tensor declares further tensors"):
        wire.recv_frame(FakeSocket(bytes(empty)))
    with pytest.raises(WireError, match="2 to 16 tensors"):
        wire.encode(wire.TENSOR, 0, tuple(torch.ones(1) for _ in range(17)))
