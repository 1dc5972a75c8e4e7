"""One TCP connection between two stages (transport.tcp.connection), over a real socket pair: JSON
frames cross intact, a frame of another kind or a payload that is not an object is refused, BYE
reaches the peer and closing wakes a reader blocked on the socket; the sender keeps frames in order."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from paretopipe.errors import PeerError, WireError
from paretopipe.transport import wire
from paretopipe.transport.tcp.connection import Connection, FrameSender, is_loopback


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                            ("localhost", True), ("10.77.65.11", False), ("0.0.0.0", False),
                                            ("stage2.lab", False)])
def test_loopback_is_read_from_the_address_never_resolved(host, loopback):
    assert is_loopback(host) is loopback


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a, None, "stage 2", wire.DEFAULT_MAX_PAYLOAD), Connection(b, None, "stage 1", wire.DEFAULT_MAX_PAYLOAD)


def test_json_crosses_intact_and_the_wrong_kind_or_shape_is_refused():
    one, two = _pair()
    try:
        records = {"later": [], "manifest": {"role": "stage2", "weights": "ab" * 32}, "n": [1, 2, 3]}
        one.send_json(wire.RECORDS, records)
        assert two.recv_json(wire.RECORDS) == records
        one.send_json(wire.RECORDS, records)
        with pytest.raises(WireError, match="RECORDS"):
            two.recv_json(wire.RUN)  # a RECORDS frame where a RUN was due
        one.send(wire.RECORDS, 0, torch.frombuffer(bytearray(b"[1, 2]"), dtype=torch.uint8))
        with pytest.raises(WireError, match="RECORDS payload must be a JSON object"):
            two.recv_json(wire.RECORDS)
    finally:
        one.close()
        two.close()


def test_bye_reaches_the_peer_and_closing_wakes_a_reader_blocked_on_the_socket():
    one, two = _pair()
    one.close(bye=True)
    assert two.reader.read().kind == wire.BYE
    one.close(bye=True)  # a second close is a no-op
    blocked: list[BaseException] = []

    def read() -> None:
        try:
            two.reader.read()
        except (PeerError, WireError, OSError) as exc:
            blocked.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    two.close()
    reader.join(5)
    assert not reader.is_alive() and blocked and two.closed


def test_the_sender_writes_frames_in_the_order_they_were_submitted():
    one, two = _pair()
    sender = FrameSender(one.writer, None, "test-send")
    sent: list[float] = []
    try:
        for seq in range(20):
            sender.submit(wire.encode(wire.TENSOR, seq, torch.full((64,), float(seq))), sent.append)
        got = [two.reader.read() for _ in range(20)]
        assert [f.seq for f in got] == list(range(20))
        assert all(torch.equal(f.tensor, torch.full((64,), float(f.seq))) for f in got)
    finally:
        sender.close()
        one.close()
        two.close()
    assert len(sent) == 20
