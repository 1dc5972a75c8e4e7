"""``--transport http``: the data port's frames as HTTP/1.1 request and response bodies, over
keep-alive connections (the standard library's threaded server and client).

The listening stage serves; the connecting stage is the client. ``POST /open`` starts a
conversation and answers its id. Each frame the client sends is one ``POST /c/ID/send`` (the body
is the frame; 204 No Content); each frame the server sends is the body of an answer to the
client's long poll ``POST /c/ID/recv`` (200 with the frame, or 204 after a second without one),
which the client keeps open on a second connection. A body over the size limit is refused with
413 and that connection closed; the server goes on serving the real peer. An empty send, or an
answer marked ``X-Closed``, ends the conversation.

This is HTTP as IoT devices use it for offloading (SCIoT's FastAPI endpoints), with one
difference: here the listening stage (stage 1) is the server and the later stage polls it, as the
data port's connections always go from the later stage to the earlier one."""

from __future__ import annotations

import http.client
import http.server
import logging
import queue
import secrets
import socket
import threading
import time
from typing import Any

from ...errors import PeerError, UsageError
from .stream import MessageListener, MessageSocket

log = logging.getLogger("paretopipe.http")

POLL_S = 1.0
MAX_CONVERSATIONS = 64  # open at once; the handshake's own bound (32 pending) is below it
HEADROOM = 1 << 20  # what a frame adds to its payload: header, descriptors, meta, a seal's tag
_CLOSED = object()


class _ServerChannel:
    """The server's side of one conversation: what the client sent, and what waits for its poll."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.sockets: list[Any] = []
        self.closed = False

    def send_message(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("the HTTP conversation is closed")
        self.outbox.put(data)

    def recv_message(self, timeout: float | None) -> bytes | None:
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no HTTP request in time")
        return None if item is _CLOSED else item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put(_CLOSED)

    def raw_sockets(self) -> list[Any]:
        return list(self.sockets)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One HTTP connection's requests: ``POST /open`` starts a conversation, ``POST /c/ID/send``
    puts a frame in its inbox, ``POST /c/ID/recv`` long-polls its outbox. A subclass per listener
    (:func:`_handler`) gives the listener, its conversations and the body limit."""

    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle would hold the body 40 ms
    server_version = "paretopipe"
    sys_version = ""
    listener: MessageListener
    conversations: dict[str, _ServerChannel]
    limit: int

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
        log.debug("%s " + format, self.client_address[0], *args)

    def _answer(self, code: int, body: bytes = b"", closed: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if closed:
            self.send_header("X-Closed", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            self._answer(411)
            return None
        if int(length) > self.limit:
            self.close_connection = True  # the body is not read: the connection cannot go on
            self._answer(413)
            return None
        return self.rfile.read(int(length))

    def do_POST(self) -> None:  # noqa: N802  (the server calls it by this name)
        body = self._body()
        if body is None:
            return
        parts = self.path.strip("/").split("/")
        if parts == ["open"] and not self.listener.closed:
            self._open()
            return
        channel = self.conversations.get(parts[1]) if len(parts) == 3 and parts[0] == "c" else None
        if channel is None or parts[2] not in ("send", "recv"):
            self._answer(404)
            return
        if self.connection not in channel.sockets:
            channel.sockets.append(self.connection)
        if parts[2] == "send":
            channel.inbox.put(body if body else _CLOSED)
            self._answer(204)
        else:
            self._poll(parts[1], channel)

    def _open(self) -> None:
        conversations = self.conversations
        for done in [c for c, ch in list(conversations.items()) if ch.closed]:  # a snapshot: other handlers add
            conversations.pop(done, None)
        if len(conversations) >= MAX_CONVERSATIONS:  # a client opening many would hold memory
            self._answer(503)
            return
        cid = secrets.token_hex(8)
        channel = conversations[cid] = _ServerChannel(self.server.server_address[0])
        channel.sockets.append(self.connection)
        self.listener.offer(MessageSocket(channel, "http"), self.client_address[0])
        self._answer(200, cid.encode())

    def _poll(self, cid: str, channel: _ServerChannel) -> None:
        """The long poll: the next frame for the client within POLL_S, else 204 (ask again)."""
        try:
            item = channel.outbox.get(timeout=POLL_S)
        except queue.Empty:
            self._answer(204)
            return
        if item is _CLOSED:
            self.conversations.pop(cid, None)
            self._answer(200, closed=True)
        else:
            self._answer(200, item)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(405)


def _handler(listener: MessageListener, conversations: dict[str, _ServerChannel], limit: int) -> type:
    return type("Handler", (_Handler,), {"listener": listener, "conversations": conversations, "limit": limit})


def listen(host: str, port: int, max_payload: int) -> MessageListener:
    """Serve conversations on ``host:port``; each one opened is offered to the returned listener."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 0..65535")
    conversations: dict[str, _ServerChannel] = {}
    listener = MessageListener((host, port), "http")
    try:
        server = http.server.ThreadingHTTPServer((host, port), _handler(listener, conversations,
                                                                        max_payload + HEADROOM))
    except (OSError, OverflowError) as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc} "
                         f"(is another run using the port?)")
    server.daemon_threads = True
    listener.address = server.server_address[:2]

    def stop() -> None:
        server.shutdown()
        server.server_close()
        for channel in conversations.values():
            channel.close()
    listener.on_close = stop
    threading.Thread(target=server.serve_forever, name="http-serve", daemon=True).start()
    return listener


class _Connection(http.client.HTTPConnection):
    """A keep-alive client connection with Nagle's algorithm off, as the data port's sockets have it."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HttpChannel:
    """The client's side: one keep-alive connection sends, another keeps a long poll open."""

    def __init__(self, host: str, port: int, cid: str, timeout: float) -> None:
        self.address, self.port, self.cid = host, port, cid
        self.sender = _Connection(host, port, timeout=timeout)
        self.poller = _Connection(host, port, timeout=POLL_S + timeout)
        self.inbox: queue.Queue = queue.Queue()
        self.closed = False
        self._thread = threading.Thread(target=self._poll, name="http-poll", daemon=True)
        self._thread.start()

    def _post(self, conn: http.client.HTTPConnection, what: str, body: bytes) -> tuple[int, bytes, bool]:
        conn.request("POST", f"/c/{self.cid}/{what}", body=body,
                     headers={"Content-Type": "application/octet-stream"})
        answer = conn.getresponse()
        data = answer.read()
        return answer.status, data, answer.getheader("X-Closed") == "1"

    def _poll(self) -> None:
        while not self.closed:
            try:
                status, data, ended = self._post(self.poller, "recv", b"")
            except (OSError, http.client.HTTPException):
                self.inbox.put(_CLOSED)
                return
            if status == 200 and ended:
                self.inbox.put(_CLOSED)
                return
            if status == 200:
                self.inbox.put(data)
            elif status != 204:
                self.inbox.put(_CLOSED)
                return

    def send_message(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("the HTTP conversation is closed")
        try:
            status, _, _ = self._post(self.sender, "send", data)
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectionError(f"HTTP send failed ({exc})")
        if status != 204:
            raise ConnectionError(f"the HTTP server answered {status} to a frame"
                                  + (" (over its size limit)" if status == 413 else ""))

    def recv_message(self, timeout: float | None) -> bytes | None:
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no HTTP answer in time")
        return None if item is _CLOSED else item

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._post(self.sender, "send", b"")
        except (OSError, http.client.HTTPException):
            pass
        self.closed = True
        self.sender.close()
        self.poller.close()

    def raw_sockets(self) -> list[Any]:
        return [s for s in (self.sender.sock, self.poller.sock) if s is not None]


def connect(host: str, port: int, connect_timeout: float) -> MessageSocket:
    """Open a conversation with the stage serving ``http://host:port/``, retrying until ``connect_timeout``."""
    if not 0 < port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 1..65535")
    deadline = time.monotonic() + connect_timeout
    while True:
        conn = http.client.HTTPConnection(host, port, timeout=min(5.0, max(0.5, connect_timeout)))
        try:
            conn.request("POST", "/open", body=b"", headers={"Content-Type": "application/octet-stream"})
            answer = conn.getresponse()
            cid = answer.read().decode("ascii", "replace")
            if answer.status == 200 and cid.isalnum():
                conn.close()
                return MessageSocket(HttpChannel(host, port, cid, max(5.0, connect_timeout)), "http")
            raise PeerError(f"{host}:{port} answered {answer.status} to POST /open: is the other stage run with "
                            f"--transport http?")
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if time.monotonic() >= deadline:
                raise PeerError(f"could not open an HTTP conversation with {host}:{port} within "
                                f"{connect_timeout:g}s ({exc}): is the other stage run with --transport http?")
            time.sleep(0.2)
