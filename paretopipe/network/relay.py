"""A TCP relay that carries a foreign peer's connections over the emulated link, and counts them.

Our own stages shape their frames at the sender (:mod:`.emulated`). A system whose sockets are not
ours (llama.cpp's RPC client and ``ggml-rpc-server``, exo, any peer) cannot be asked to: it
connects to the relay instead, and the relay forwards every byte to the real peer, each direction
through an :class:`~.emulated.EmulatedLink` of the same conditions (rate, delay, jitter, loss,
traces) that a sweep gives our own stages. The relay also counts what crossed: bytes each way and
round trips, which is what a foreign engine's cost per token is made of.

A round trip is a turn of one connection's conversation: bytes towards the server, then bytes
back. A request split over many reads, or a reply over many writes, is still one; turns are counted
per connection, since a client that talks over several connections at once interleaves them.
:meth:`LinkRelay.shape` changes the conditions of connections already open (a sweep moves a
long-lived peer from one network to the next without reconnecting it). The relay's own cost (its
threads, its copies) is what ``benchmarks/relay.py`` measures on an unshaped link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import socket
import threading
from typing import Any, Iterable

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


def sum_counts(counts: Iterable[RelayCounts]) -> RelayCounts:
    """What crossed several relays (one per server of a client that talks to each)."""
    total = RelayCounts()
    for c in counts:
        total = RelayCounts(*(a + b for a, b in zip(dataclasses.astuple(total), dataclasses.astuple(c))))
    return total


class LinkRelay:
    """Listens on ``listen`` and forwards each connection to ``target``: ``up`` shapes what the
    client sends, ``down`` what the server answers (None: unshaped). Every connection shares the
    two directions' links, as connections share a real link."""

    def __init__(self, target: tuple[str, int], up: Direction | None = None, down: Direction | None = None,
                 listen: tuple[str, int] = ("127.0.0.1", 0), seed: int = 0) -> None:
        self.target, self.listen_at = target, listen
        self._counts = RelayCounts()
        self._lock = threading.Lock()
        self._senders: list[tuple[str, LinkSender]] = []  # every open connection's, by direction
        self.links: dict[str, EmulatedLink | None] = {}
        self.shape(up, down, seed)
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

    def shape(self, up: Direction | None, down: Direction | None, seed: int = 0) -> None:
        """The conditions of each direction from now on, for new and open connections alike (their
        queued bytes keep the schedule they were given)."""
        links = {"up": EmulatedLink(up, seed, which="up") if up and up.is_shaped else None,
                 "down": EmulatedLink(down, seed + 1, which="down") if down and down.is_shaped else None}
        with self._lock:
            self.links = links
            for direction, sender in self._senders:
                sender.link = links[direction]

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
        turns = _Turns()
        ends = [threading.Thread(target=self._pump, args=(client, server, "up", turns), daemon=True),
                threading.Thread(target=self._pump, args=(server, client, "down", turns), daemon=True)]
        for t in ends:
            t.start()
        for t in ends:
            t.join()
        with self._lock:  # a long run's connections come and go: keep only the open ones
            self._sockets = [s for s in self._sockets if s not in (client, server)]
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str, turns: "_Turns") -> None:
        """Carry one direction until its sender closes it, then close it at the other end once the
        link has delivered everything before."""
        with self._lock:
            sender = LinkSender(self.links[direction], f"relay-{direction}")
            self._senders.append((direction, sender))
        try:
            while sender.error is None:
                try:
                    data = src.recv(CHUNK_BYTES)
                except OSError:
                    break
                if not data:
                    break
                self._record(direction, len(data), turns)
                try:
                    sender.submit(len(data), functools.partial(dst.sendall, data))
                except Exception:  # noqa: BLE001 - the other end is gone: what its send raised
                    break
            if sender.error is None:
                sender.submit(0, functools.partial(_shut_write, dst))
        finally:
            sender.close(timeout=60.0)
            with self._lock:
                self._senders = [(d, s) for d, s in self._senders if s is not sender]

    def _record(self, direction: str, nbytes: int, turns: "_Turns") -> None:
        with self._lock:
            if direction == "up":
                self._counts.up_bytes += nbytes
            else:
                self._counts.down_bytes += nbytes
                if turns.last == "up":
                    self._counts.round_trips += 1
            turns.last = direction


@dataclasses.dataclass
class _Turns:
    """One connection's last direction (a turn is counted when it changes from up to down)."""

    last: str | None = None


def _shut_write(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_WR)
