"""An in-memory byte stream with the socket methods the frame reader and writer use, so a TCP
stage's endpoint can be driven frame by frame from a test, without a socket: what one end sends
the other receives, in order, and closing or shutting down one end ends the other's reads.

A fake by necessity of the test, not of the machine: the stages' own tests run over real sockets
(tests/transport/tcp/test_tcp.py); these drive one endpoint through exact sequences of frames."""

from __future__ import annotations

import socket
import threading
import time

from paretopipe.transport import wire
from paretopipe.transport.tcp.connection import Connection


class _Pipe:
    """One direction: bytes written and not yet read, and whether the writer is gone."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.cond = threading.Condition()


class MemorySocket:
    def __init__(self, inbox: _Pipe, outbox: _Pipe) -> None:
        self.inbox, self.outbox = inbox, outbox
        self.timeout: float | None = None

    def settimeout(self, value: float | None) -> None:
        self.timeout = value

    def sendmsg(self, buffers) -> int:
        data = b"".join(bytes(memoryview(b).cast("B")) for b in buffers)
        with self.outbox.cond:
            if self.outbox.closed:
                raise BrokenPipeError(32, "Broken pipe")
            self.outbox.data += data
            self.outbox.cond.notify_all()
        return len(data)

    def recv_into(self, view, nbytes: int = 0, flags: int = 0) -> int:
        view = memoryview(view).cast("B")
        want = nbytes or view.nbytes
        need = want if flags & socket.MSG_WAITALL else 1
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self.inbox.cond:
            while len(self.inbox.data) < need and not self.inbox.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise socket.timeout("timed out")
                self.inbox.cond.wait(left)
            n = min(want, len(self.inbox.data))
            view[:n] = self.inbox.data[:n]
            del self.inbox.data[:n]
            return n

    def shutdown(self, _how: int = socket.SHUT_RDWR) -> None:
        self.close()

    def close(self) -> None:
        for pipe in (self.inbox, self.outbox):
            with pipe.cond:
                pipe.closed = True
                pipe.cond.notify_all()


def socket_pair() -> tuple[MemorySocket, MemorySocket]:
    a_to_b, b_to_a = _Pipe(), _Pipe()
    return MemorySocket(b_to_a, a_to_b), MemorySocket(a_to_b, b_to_a)


class ScriptedPeer:
    """The test's end: frames written with the stages' own writer and read with their own reader."""

    def __init__(self, sock: MemorySocket) -> None:
        self.sock = sock
        self.writer = wire.FrameWriter(sock)
        self.reader = wire.FrameReader(sock)

    def send(self, kind: int, seq: int = 0, tensor=None, meta: dict | None = None) -> None:
        self.writer.send(wire.encode(kind, seq, tensor, meta))

    def read(self, timeout: float = 60.0) -> wire.Frame:
        return self.reader.read(time.monotonic() + timeout)


def connection_pair(max_payload: int = 1 << 30) -> tuple[Connection, ScriptedPeer]:
    """A stage's :class:`Connection` (authenticated, plain) and the scripted peer at its other end."""
    mine, theirs = socket_pair()
    return Connection(mine, None, "scripted", max_payload), ScriptedPeer(theirs)


def in_thread(fn, *args, **kw) -> tuple[threading.Thread, dict]:
    """Run a stage's endpoint as its process would, on a thread of its own; the dict gets its
    ``result`` or the ``error`` it raised, for the test to read once the thread is done."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn(*args, **kw)
        except Exception as exc:  # the test reads it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
