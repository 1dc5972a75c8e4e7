"""The data port over the IoT protocols: ``--transport tcp|websocket|mqtt|http``.

Every transport carries the TCP backend's frames unchanged (handshake, weights and cut checks,
sealing, deadlines, records): a message transport is wrapped as a socket
(:mod:`.stream`), one frame per message. ``listen`` and ``connect`` are what the stage
commands and workers call instead of the TCP ones.

- ``tcp``: the raw socket (:mod:`paretopipe.transport.tcp.connection`);
- ``websocket``: binary WebSocket messages (:mod:`.websocket`);
- ``mqtt``: MQTT messages through a Mosquitto broker (:mod:`.mqtt`, :mod:`.broker`);
- ``http``: HTTP/1.1 request and response bodies on keep-alive connections (:mod:`.http`).
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import time
from typing import Any

from ...errors import UsageError
from .http import connect as http_connect, listen as http_listen
from .mqtt import MqttSettings, connect as mqtt_connect, listen as mqtt_listen
from .sockets import connect_with_retry, listen as tcp_listen
from .stream import MessageListener, MessageSocket

TRANSPORTS = ("tcp", "websocket", "mqtt", "http")


def check_transport(name: str) -> str:
    if name not in TRANSPORTS:
        raise UsageError(f"unknown transport {name!r}; valid: {', '.join(TRANSPORTS)}")
    return name


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """Which transport a stage's data port uses, and (MQTT) through which broker as whom."""

    name: str = "tcp"
    mqtt: MqttSettings | None = None

    def __post_init__(self) -> None:
        check_transport(self.name)
        if self.name == "mqtt" and self.mqtt is None:
            raise UsageError("--transport mqtt needs a broker (MQTT_BROKER in .env)")


def listen(spec: TransportSpec, host: str, port: int, max_payload: int) -> Any:
    """A listening socket (tcp) or a :class:`MessageListener` for ``StageListener``."""
    if spec.name == "tcp":
        return tcp_listen(host, port)
    if spec.name == "websocket":
        # lazy for start-up: websockets
        from .websocket import listen as ws_listen

        return ws_listen(host, port, max_payload)
    if spec.name == "http":
        return http_listen(host, port, max_payload)
    return mqtt_listen(spec.mqtt, port)


def connect(spec: TransportSpec, host: str, port: int, connect_timeout: float, max_payload: int) -> Any:
    """A connected socket (tcp) or :class:`MessageSocket` to the stage listening at host:port; a
    message socket keeps what opening it took (``connect_s``: the WebSocket upgrade, MQTT's
    connection, subscription and open, HTTP's ``POST /open``)."""
    started = time.monotonic()
    sock = _connect(spec, host, port, connect_timeout, max_payload)
    if isinstance(sock, MessageSocket):
        sock.connect_s = time.monotonic() - started
    return sock


def _connect(spec: TransportSpec, host: str, port: int, connect_timeout: float, max_payload: int) -> Any:
    if spec.name == "tcp":
        return connect_with_retry(host, port, connect_timeout)
    if spec.name == "websocket":
        # lazy for start-up: websockets
        from .websocket import connect as ws_connect

        return ws_connect(host, port, connect_timeout, max_payload)
    if spec.name == "http":
        return http_connect(host, port, connect_timeout)
    return mqtt_connect(spec.mqtt, port, connect_timeout)


def _tcp_bytes(sock: Any) -> dict[str, int]:
    """What the kernel counts for a TCP socket: bytes sent (without retransmissions) and received;
    {} where TCP_INFO does not carry them (kernels before 4.19, other systems)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except (OSError, AttributeError, ValueError):
        return {}
    if len(info) < 208:
        return {}
    return {"socket_bytes_sent": struct.unpack_from("Q", info, 200)[0],
            "socket_bytes_received": struct.unpack_from("Q", info, 128)[0]}


def counters(sock: Any) -> dict[str, int]:
    """A connection's running counts: the frames' bytes and messages a message transport carried,
    and the bytes its TCP socket put on the wire (framing, the protocol's own traffic, and for
    MQTT this process's side of the broker hop)."""
    if isinstance(sock, MessageSocket):
        totals: dict[str, int] = {}
        for raw in sock.channel.raw_sockets():
            for k, v in _tcp_bytes(raw).items():
                totals[k] = totals.get(k, 0) + v
        return {**sock.counters(), **totals}
    return _tcp_bytes(sock)


def usage(sock: Any, before: dict[str, int] | None = None) -> dict[str, Any]:
    """What the manifest says of a connection's transport over a run: its name, the counts of
    :func:`counters` since ``before``, the framing overhead (socket bytes per frame byte sent),
    and for MQTT the broker, its version and the QoS."""
    now = counters(sock)
    counts = {k: v - (before or {}).get(k, 0) for k, v in now.items()}
    name = sock.transport if isinstance(sock, MessageSocket) else "tcp"
    out: dict[str, Any] = {"transport": name, **counts}
    frames = counts.get("bytes_sent")
    if frames and counts.get("socket_bytes_sent") is not None:
        out["socket_bytes_per_frame_byte"] = round(counts["socket_bytes_sent"] / frames, 6)
    if isinstance(sock, MessageSocket) and sock.connect_s is not None:
        out["connect_s"] = round(sock.connect_s, 6)
    client = getattr(sock.channel, "client", None) if name == "mqtt" else None
    if client is not None:
        out.update(client.settings.describe())
        out["broker_version"] = client.broker_version()
        out["broker_round_trip_s"] = client.round_trip_s()
    return out


__all__ = ["TRANSPORTS", "MessageListener", "MessageSocket", "MqttSettings", "TransportSpec", "check_transport",
           "connect", "counters", "listen", "usage"]
