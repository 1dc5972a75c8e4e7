"""A message transport seen as a socket: the real frame writer and reader over a pair of
in-memory channels (the one part here that is not a network: the transports have their own tests)."""

from __future__ import annotations

import queue
import socket
import time

import pytest
import torch

from paretopipe.errors import PeerError, WireError
from paretopipe.transport import wire
from paretopipe.transport.messaging.stream import MessageListener, MessageSocket


class QueueChannel:
    """One side of an in-memory conversation: what it sends, the other side receives."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self.inbox, self.outbox, self.address, self.sent = inbox, outbox, "memory", []

    def send_message(self, data: bytes) -> None:
        self.sent.append(len(data))
        self.outbox.put(data)

    def recv_message(self, timeout):
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("nothing")

    def close(self) -> None:
        self.outbox.put(b"")

    def raw_sockets(self):
        return []


def pair():
    a, b = queue.Queue(), queue.Queue()
    left, right = QueueChannel(a, b), QueueChannel(b, a)
    return MessageSocket(left, "memory"), MessageSocket(right, "memory"), left, right


def test_each_frame_is_one_message_and_reads_back_bit_for_bit_with_read_ahead():
    s1, s2, left, _ = pair()
    writer, reader = wire.FrameWriter(s1), wire.FrameReader(s2)
    tensors = [torch.randn(2, 3, 7, 7), torch.arange(10, dtype=torch.int64), torch.randn(1, 1000)]
    for seq, t in enumerate(tensors):
        writer.send(wire.encode(wire.TENSOR, seq, t, meta={"n": seq}))
    assert left.sent and len(left.sent) == len(tensors)  # one message per frame
    for seq, t in enumerate(tensors):
        f = reader.read(deadline=None)
        assert (f.kind, f.seq, f.meta) == (wire.TENSOR, seq, {"n": seq})
        assert torch.equal(f.tensor, t)
    assert s1.counters()["messages_sent"] == 3 and s2.counters()["bytes_received"] == s1.counters()["bytes_sent"]


def test_a_frame_split_over_messages_still_reads_and_garbage_is_refused_by_the_frame_checks():
    s1, s2, left, _ = pair()
    enc = wire.encode(wire.TENSOR, 4, torch.ones(3, 5))
    whole = b"".join(bytes(memoryview(b).cast("B")) for b in enc.buffers)
    s1.sendall(whole[:10])
    s1.sendall(whole[10:])
    f = wire.FrameReader(s2).read(deadline=None)
    assert f.seq == 4 and torch.equal(f.tensor, torch.ones(3, 5))
    s1.sendall(b"GET / HTTP/1.1\r\n" * 16)  # a hostile peer's message: not a frame
    with pytest.raises(WireError, match="magic"):
        wire.FrameReader(s2).read(deadline=time.monotonic() + 5)


def test_an_empty_message_is_the_end_and_a_silent_peer_times_out():
    s1, s2, _, _ = pair()
    s2.settimeout(0.05)
    with pytest.raises(socket.timeout):
        s2.recv_into(bytearray(4))
    s1.close()  # sends the empty message
    assert s2.recv_into(bytearray(4)) == 0
    with pytest.raises(PeerError, match="peer closed"):
        wire.recv_frame(s2)
    with pytest.raises(BrokenPipeError):
        s1.sendall(b"x")


def test_the_listener_hands_out_what_was_offered_and_times_out_when_nothing_was():
    s1, _, _, _ = pair()
    listener = MessageListener(("127.0.0.1", 7), "memory")
    listener.settimeout(0.05)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.offer(s1, "peer")
    assert listener.accept() == (s1, ("peer", 0))
    listener.offer(s1, "late")
    listener.close()
    assert s1.closed  # what nobody accepted is closed with the listener
    with pytest.raises(OSError):
        listener.accept()
