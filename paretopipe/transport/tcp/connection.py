"""A TCP connection between two stages: the authenticated connection that carries any number of
runs (its sockets: ``messaging.sockets``), and the thread that sends its frames in order through
an emulated link."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Callable

import torch

from ...errors import ParetoPipeError, WireError
from ...network.emulated import EmulatedLink, LinkSender, Outage
from .. import aead, messaging, wire
from .messages import Hello, json_payload, json_tensor


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Connection:
    """One authenticated connection between stage 1 and stage 2; it carries any number of runs."""

    def __init__(self, sock: socket.socket, peer: Hello | None, address: str, max_payload: int,
                 channel: aead.Channel | None = None) -> None:
        self.sock, self.peer, self.address, self.channel = sock, peer, address, channel
        self.pool = wire.BufferPool()
        self.reader = wire.FrameReader(sock, max_payload, self.pool, opener=channel.recv if channel else None)
        self.writer = wire.FrameWriter(sock, sealer=channel.send if channel else None)
        self.runs = 0
        self.closed = False
        self._transport_mark: dict[str, int] = {}
        self.handshake_s: float | None = None  # CHALLENGE to HELLO_OK, on this side's clock

    @property
    def cipher(self) -> str:
        return self.channel.cipher if self.channel is not None else "none"

    def mark_transport(self) -> None:
        """A run starts: its transport counts are from here on."""
        self._transport_mark = messaging.counters(self.sock)

    def transport_usage(self) -> dict[str, Any]:
        """The manifest's account of this connection's transport since :meth:`mark_transport`."""
        return {**messaging.usage(self.sock, self._transport_mark), "handshake_s": self.handshake_s}

    def send(self, kind: int, seq: int = 0, tensor: torch.Tensor | None = None, meta: dict | None = None) -> None:
        self.writer.send(wire.encode(kind, seq, tensor, meta))

    def send_json(self, kind: int, obj: dict[str, Any]) -> None:
        self.send(kind, 0, json_tensor(obj))

    def recv_json(self, kind: int, deadline: float | None = None) -> dict[str, Any]:
        out = json_payload(wire.expect(self.reader.read(deadline), kind))
        if not isinstance(out, dict):
            raise WireError(f"{wire.KIND_NAMES[kind]} payload must be a JSON object")
        return out

    def close(self, bye: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if bye:
            try:
                self.sock.settimeout(2.0)
                self.send(wire.BYE)
            except (ParetoPipeError, OSError):
                pass
        # Shut down before closing: close alone neither wakes a thread blocked reading the socket
        # (a run's reader, after the run failed) nor, while that thread holds it, ends the
        # connection, so the peer would wait for its timeout (as tcp.sink's _end_upstream does).
        for end in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                end()
            except OSError:
                pass


class FrameSender(LinkSender):
    """Sends frames in FIFO order from a thread; with an emulated link, each frame is written
    when the link says it has fully arrived, so concurrent frames share the link's rate."""

    def __init__(self, writer: wire.FrameWriter, link: EmulatedLink | None, name: str,
                 outage: Outage | None = None) -> None:
        super().__init__(link, name, outage)
        self.writer = writer

    def submit(self, enc: wire.Encoded, on_sent: Callable[[float], None] | None = None) -> None:
        super().submit(enc.total_nbytes + self.writer.overhead, lambda: self.writer.send(enc), on_sent)
