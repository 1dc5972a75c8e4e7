"""A message transport seen as a socket, so that the TCP backend's frames, handshake, sealing,
deadlines and records run on it unchanged.

Each frame travels as one binary message (the frame writer sends a frame with one ``sendmsg``,
which becomes one ``send_message``); the reader takes the messages' bytes in order, so a frame a
hostile peer splits or pads is refused by the same frame checks as on TCP. An empty message
means the peer closed: no frame is empty.

A transport supplies a :class:`Channel` (one conversation's send, receive and close); this module
makes it a :class:`MessageSocket`, and a queue of them a :class:`MessageListener`, which is what
``StageListener`` accepts from.
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any, Protocol


class Channel(Protocol):
    """One conversation of a message transport, both directions."""

    address: str

    def send_message(self, data: bytes) -> None:
        """Send one binary message (raises ``ConnectionError`` once the conversation is over)."""

    def recv_message(self, timeout: float | None) -> bytes | None:
        """The next message; None once the peer closed; ``TimeoutError`` after ``timeout`` s."""

    def close(self) -> None:
        """End the conversation (the peer's next receive returns None)."""

    def raw_sockets(self) -> list[Any]:
        """The TCP sockets under the conversation (their kernel counters)."""


class MessageSocket:
    """The subset of a connected socket the frame reader, writer and handshake use, over a
    :class:`Channel`. Counts what crosses it: ``messages_sent`` and ``bytes_sent`` (the frames'
    bytes, before the transport's own framing), and the same received."""

    def __init__(self, channel: Channel, transport: str) -> None:
        self.channel, self.transport = channel, transport
        self._timeout: float | None = None
        self._pending = memoryview(b"")
        self._eof = False
        self._closed = threading.Event()
        self.messages_sent = self.bytes_sent = self.messages_received = self.bytes_received = 0
        self.connect_s: float | None = None  # set by the dialler: what opening the conversation took

    # -- sending ---------------------------------------------------------------------------------
    def sendmsg(self, buffers: Any, *_: Any) -> int:
        data = b"".join(memoryview(b).cast("B") for b in buffers)
        self._send(data)
        return len(data)

    def sendall(self, data: Any) -> None:
        self._send(bytes(data))

    def _send(self, data: bytes) -> None:
        if self._closed.is_set():
            raise BrokenPipeError(32, "the connection is closed")
        if not data:
            return
        try:
            self.channel.send_message(data)
        except TimeoutError:
            raise socket.timeout("timed out sending a message")
        except ConnectionError as exc:
            raise BrokenPipeError(32, str(exc) or "the peer closed the connection")
        self.messages_sent += 1
        self.bytes_sent += len(data)

    # -- receiving -------------------------------------------------------------------------------
    def _fill(self) -> bool:
        """Have bytes pending (True), or the peer closed (False)."""
        while not self._pending.nbytes:
            if self._eof or self._closed.is_set():
                return False
            data = self.channel.recv_message(self._timeout)  # TimeoutError is socket.timeout
            if not data:
                self._eof = True
                return False
            self.messages_received += 1
            self.bytes_received += len(data)
            self._pending = memoryview(data)
        return True

    def recv_into(self, view: Any, nbytes: int = 0, *_: Any) -> int:
        target = memoryview(view).cast("B")
        want = nbytes or target.nbytes
        if not self._fill():
            return 0
        n = min(want, self._pending.nbytes)
        target[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def recv(self, bufsize: int, *_: Any) -> bytes:
        buf = bytearray(bufsize)
        return bytes(buf[:self.recv_into(buf)])

    def recvmsg_into(self, buffers: Any, *_: Any) -> tuple[int, list, int, Any]:
        """Fills the buffers in order from the bytes at hand (one message at most), as a stream
        socket's scatter read does from what has arrived."""
        got = 0
        for buf in buffers:
            target = memoryview(buf).cast("B")
            while target.nbytes:
                if got and not self._pending.nbytes:
                    return got, [], 0, None
                n = self.recv_into(target)
                if n == 0:
                    return got, [], 0, None
                got += n
                target = target[n:]
        return got, [], 0, None

    # -- the rest of a socket --------------------------------------------------------------------
    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def setsockopt(self, *_: Any) -> None:
        """Socket options (TCP_NODELAY) belong to the transport's own sockets."""

    def getsockname(self) -> tuple[str, int]:
        return (self.channel.address, 0)

    def shutdown(self, _how: int = socket.SHUT_RDWR) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            try:
                self.channel.close()
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> "MessageSocket":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def wait_closed(self, timeout: float) -> bool:
        return self._closed.wait(timeout)

    def counters(self) -> dict[str, int]:
        return {"messages_sent": self.messages_sent, "bytes_sent": self.bytes_sent,
                "messages_received": self.messages_received, "bytes_received": self.bytes_received}


class MessageListener:
    """The subset of a listening socket ``StageListener`` uses: connections are put here by the
    transport's server as they open, and taken by ``accept``."""

    def __init__(self, address: tuple[str, int], transport: str, on_close: Any = None) -> None:
        self.address, self.transport = address, transport
        self._incoming: queue.Queue = queue.Queue()
        self._timeout: float | None = None
        self.on_close = on_close  # the transport's server stops with the listener
        self.closed = False

    def offer(self, stream: MessageSocket, peer: str) -> None:
        if self.closed:
            stream.close()
            return
        self._incoming.put((stream, (peer, 0)))

    def accept(self) -> tuple[MessageSocket, tuple[str, int]]:
        if self.closed:
            raise OSError(9, "the listener is closed")
        try:
            return self._incoming.get(timeout=self._timeout)
        except queue.Empty:
            raise socket.timeout("no connection")

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def getsockname(self) -> tuple[str, int]:
        return self.address

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        while True:
            try:
                stream, _ = self._incoming.get_nowait()
            except queue.Empty:
                break
            stream.close()
        if self.on_close is not None:
            self.on_close()
