"""A TCP relay that carries a foreign peer's connections over the emulated link, and counts them.

Our own stages shape their frames at the sender (:mod:`.emulated`). A system whose sockets are not
ours (llama.cpp's RPC client and ``ggml-rpc-server``, exo, any peer) cannot be asked to: it
connects to the relay instead, and the relay forwards every byte to the real peer, each direction
through an :class:`~.emulated.EmulatedLink` of the same conditions (rate, delay, jitter, loss,
traces) that a sweep gives our own stages. The relay also counts what crossed: bytes each way and
round trips, which is what a foreign engine's cost per token is made of.

A round trip is a turn of the conversation: bytes towards the server, then bytes back. A request
split over many reads, or a reply over many writes, is still one. The relay's own cost (its
threads, its copies) is what ``benchmarks/relay.py`` measures on an unshaped link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import socket
import threading
from typing import Any

from .conditions import Direction
from .emulated import EmulatedLink, LinkSender

log = logging.getLogger("paretopipe.relay")

CHUNK_BYTES = 1 << 16
CONNECT_TIMEOUT_S = 10.0


@dataclasses.dataclass
class RelayCounts:
    """What crossed the relay, over every connection it carried."""

    connections: int = 0
    refused: int = 0          # clients whose server could not be reached (each closed at once)
    up_bytes: int = 0         # client -> server
    down_bytes: int = 0       # server -> client
    round_trips: int = 0      # turns from up to down

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class LinkRelay:
    """Listens on ``listen`` and forwards each connection to ``target``: ``up`` shapes what the
    client sends, ``down`` what the server answers (None: unshaped). Every connection shares the
    two directions' links, as connections share a real link."""

    def __init__(self, target: tuple[str, int], up: Direction | None = None, down: Direction | None = None,
                 listen: tuple[str, int] = ("127.0.0.1", 0), seed: int = 0) -> None:
        self.target, self.listen_at = target, listen
        self.links = {"up": EmulatedLink(up, seed, which="up") if up and up.is_shaped else None,
                      "down": EmulatedLink(down, seed + 1, which="down") if down and down.is_shaped else None}
        self._counts = RelayCounts()
        self._last_direction: str | None = None
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self.port: int | None = None  # where it listens, once started
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()

    def start(self) -> int:
        """Listen and serve in the background; returns the port."""
        self._server = socket.create_server(self.listen_at, reuse_port=False)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="relay-accept", daemon=True).start()
        return self.port

    def counts(self) -> RelayCounts:
        with self._lock:
            return dataclasses.replace(self._counts)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in ([self._server] if self._server else []) + sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> "LinkRelay":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="relay-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            log.warning("relay: %s:%d refused a connection (%s); the client is closed", *self.target, exc)
            with self._lock:
                self._counts.refused += 1
            client.close()
            return
        server.settimeout(None)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._counts.connections += 1
            self._sockets += [client, server]
        ends = [threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True),
                threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True)]
        for t in ends:
            t.start()
        for t in ends:
            t.join()
        with self._lock:  # a long run's connections come and go: keep only the open ones
            self._sockets = [s for s in self._sockets if s not in (client, server)]
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        """Carry one direction until its sender closes it, then close it at the other end once the
        link has delivered everything before."""
        sender = LinkSender(self.links[direction], f"relay-{direction}")
        try:
            while sender.error is None:
                try:
                    data = src.recv(CHUNK_BYTES)
                except OSError:
                    break
                if not data:
                    break
                self._record(direction, len(data))
                try:
                    sender.submit(len(data), functools.partial(dst.sendall, data))
                except Exception:  # noqa: BLE001 - the other end is gone: what its send raised
                    break
            if sender.error is None:
                sender.submit(0, functools.partial(_shut_write, dst))
        finally:
            sender.close(timeout=60.0)

    def _record(self, direction: str, nbytes: int) -> None:
        with self._lock:
            if direction == "up":
                self._counts.up_bytes += nbytes
            else:
                self._counts.down_bytes += nbytes
                if self._last_direction == "up":
                    self._counts.round_trips += 1
            self._last_direction = direction


def _shut_write(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_WR)
