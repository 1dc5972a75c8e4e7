"""``--transport websocket``: the data port's frames as binary WebSocket messages (RFC 6455),
with the ``websockets`` library's threaded client and server.

The listening stage serves ``ws://HOST:PORT/``; the connecting stage dials it over a TCP
connection made as the TCP backend makes one (retried until the connect timeout). A message
over the size limit is refused by the library (close code 1009) on that connection alone, a
text message by this module: the server goes on serving the real peer. No proxy is ever used
and per-message compression is off: the codecs are the suite's (``--compression``)."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from ...errors import PeerError, UsageError
from .sockets import connect_with_retry, listen as tcp_listen
from .stream import MessageListener, MessageSocket

log = logging.getLogger("paretopipe.websocket")
# The library logs every connection's opening and closing at INFO: a sweep's log needs its problems only.
_library_log = logging.getLogger("paretopipe.websocket.library")
_library_log.setLevel(logging.WARNING)

#: What a frame may add to its payload in one message: header, descriptors, meta, a seal's tag.
MESSAGE_HEADROOM = 1 << 20


class WebSocketChannel:
    """One WebSocket connection as a :class:`~.stream.Channel`."""

    def __init__(self, ws: Any, address: str) -> None:
        self.ws, self.address = ws, address

    def send_message(self, data: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionError(f"the WebSocket closed ({exc})")

    def recv_message(self, timeout: float | None) -> bytes | None:
        from websockets.exceptions import ConnectionClosed

        try:
            data = self.ws.recv(timeout=timeout)
        except ConnectionClosed:
            return None
        if isinstance(data, str):
            self.ws.close(1003, "binary messages only")
            raise PeerError("the peer sent a text message; the data port takes binary frames only")
        return data

    def close(self) -> None:
        self.ws.close()

    def raw_sockets(self) -> list[Any]:
        return [self.ws.socket]


def listen(host: str, port: int, max_payload: int) -> MessageListener:
    """Serve WebSocket connections on ``host:port``; each one is offered to the returned listener."""
    from websockets.sync.server import serve

    sock = tcp_listen(host, port)  # the same port checks and one-line refusal as TCP
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted connections inherit it
    address = sock.getsockname()
    listener: MessageListener

    def handler(ws: Any) -> None:
        stream = MessageSocket(WebSocketChannel(ws, address[0]), "websocket")
        listener.offer(stream, str(ws.remote_address[0]) if ws.remote_address else "?")
        # The library closes the connection when this returns: wait for the stream's end.
        while not stream.closed and ws.state.name == "OPEN":
            stream.wait_closed(1.0)

    server = serve(handler, sock=sock, compression=None, max_size=max_payload + MESSAGE_HEADROOM,
                   server_header=None, logger=_library_log)
    listener = MessageListener((address[0], address[1]), "websocket", on_close=server.shutdown)
    threading.Thread(target=server.serve_forever, name="websocket-serve", daemon=True).start()
    return listener


def connect(host: str, port: int, connect_timeout: float, max_payload: int) -> MessageSocket:
    """Dial ``ws://host:port/`` (retrying the TCP connection until ``connect_timeout``)."""
    from websockets.exceptions import InvalidURI, WebSocketException
    from websockets.sync.client import connect as ws_connect

    sock = connect_with_retry(host, port, connect_timeout)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        ws = ws_connect(f"ws://{netloc}/", sock=sock, compression=None, proxy=None, user_agent_header=None,
                        max_size=max_payload + MESSAGE_HEADROOM, open_timeout=max(1.0, connect_timeout),
                        logger=_library_log, legacy=True)  # legacy: a connection kept past this call
    except InvalidURI as exc:
        sock.close()
        raise UsageError(f"--host {host}: not a WebSocket address ({exc})")
    except (WebSocketException, OSError, TimeoutError) as exc:
        sock.close()
        raise PeerError(f"{host}:{port} did not open a WebSocket ({exc}): is the other stage run with "
                        f"--transport websocket?")
    return MessageSocket(WebSocketChannel(ws, host), "websocket")
