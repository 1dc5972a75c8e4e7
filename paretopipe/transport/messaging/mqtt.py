"""``--transport mqtt``: the data port's frames as MQTT messages through a broker (Mosquitto),
with the ``paho-mqtt`` client.

The listening stage's address is a place in the broker's topic tree, not a socket: a listener
on port P of namespace NS subscribes ``NS/pP/+/open`` and ``NS/pP/+/d``. A dialling stage picks a connection id C,
subscribes ``NS/pP/C/l`` (what the listener says to it), then publishes an empty message on
``NS/pP/C/open`` until the listener's first frame (its CHALLENGE) arrives; its frames go to
``NS/pP/C/d``. An empty message on a data topic closes that side. The broker's ACL lets a
run's users use their namespace only (:mod:`.broker`); within it, a client that publishes
garbage or another run's frames is refused by the frame checks like any peer on TCP.

QoS 0 or 1 (``--mqtt-qos``); the broker keeps each publisher's order on a topic, which the byte
stream of frames relies on."""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import socket
import threading
import time
from typing import Any

from ...argtypes import host_port
from ...errors import PeerError, UsageError
from .stream import MessageListener, MessageSocket

log = logging.getLogger("paretopipe.mqtt")

QOS_LEVELS = (0, 1)
ENV_KEYS = ("MQTT_BROKER", "MQTT_USERNAME", "MQTT_PASSWORD", "MQTT_NAMESPACE")
OPEN_RETRY_S = 0.5
MAX_CONVERSATIONS = 64
_CLOSED = object()


@dataclasses.dataclass(frozen=True)
class MqttSettings:
    """Where the broker is and who this stage is to it. The password is never recorded."""

    host: str
    port: int = 1883
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    namespace: str = "paretopipe"
    qos: int = 0

    @classmethod
    def from_env(cls, env: dict[str, str], qos: int = 0) -> "MqttSettings":
        """From ``.env``'s MQTT_BROKER (HOST:PORT), MQTT_USERNAME, MQTT_PASSWORD, MQTT_NAMESPACE."""
        broker = env.get("MQTT_BROKER")
        if not broker:
            raise UsageError("--transport mqtt needs a broker: set MQTT_BROKER=HOST:PORT (and MQTT_USERNAME, "
                             "MQTT_PASSWORD) in .env, or start one with paretopipe broker")
        host, port = parse_broker(broker)
        return cls(host, port, env.get("MQTT_USERNAME") or None, env.get("MQTT_PASSWORD") or None,
                   check_namespace(env.get("MQTT_NAMESPACE") or "paretopipe"), check_qos(qos))

    def describe(self) -> dict[str, Any]:
        return {"broker": f"{self.host}:{self.port}", "namespace": self.namespace, "qos": self.qos,
                "username": self.username}


def parse_broker(text: str) -> tuple[str, int]:
    return host_port(text, f"MQTT_BROKER={text!r}", "127.0.0.1:1883")


def check_namespace(ns: str) -> str:
    if not ns or any(c in ns for c in "+#\0") or ns.startswith("$") or len(ns) > 200:
        raise UsageError(f"MQTT_NAMESPACE={ns!r}: a topic prefix without +, # or a leading $")
    return ns.strip("/")


def check_qos(qos: int) -> int:
    if qos not in QOS_LEVELS:
        raise UsageError(f"--mqtt-qos {qos}: valid: {', '.join(map(str, QOS_LEVELS))}")
    return qos


class MqttClient:
    """One paho client, connected and looping, whose messages go to ``on_message(topic, payload)``."""

    def __init__(self, settings: MqttSettings, name: str, on_message: Any, timeout: float) -> None:
        import paho.mqtt.client as mqtt

        self.settings = settings
        # From the OS, not the random module: a program that seeds it (hypothesis, a seeded run)
        # would give two clients one id, and the broker drops the first when the second connects.
        self.client_id = f"{name}-{secrets.token_hex(5)}"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv311)
        if settings.username:
            self.client.username_pw_set(settings.username, settings.password)
        self.client.max_queued_messages_set(0)
        self.client.max_inflight_messages_set(64)
        self._connected = threading.Event()
        self._refused: str | None = None
        self._subscribed: dict[int, threading.Event] = {}
        self._granted: dict[int, list] = {}
        self.version: str | None = None
        self._version_seen = threading.Event()
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.echo_topic = f"{settings.namespace}/echo/{self.client_id}"
        self._echo: queue.Queue = queue.Queue()
        self._echo_subscribed = False
        self.client.on_message = lambda _c, _u, msg: (
            self._on_version(msg) if msg.topic == "$SYS/broker/version"
            else self._echo.put(time.monotonic()) if msg.topic == self.echo_topic
            else on_message(msg.topic, msg.payload))
        where = f"{settings.host}:{settings.port}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client.connect(settings.host, settings.port, keepalive=30)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise PeerError(f"MQTT broker {where} unreachable ({exc.strerror or exc})")
                time.sleep(0.2)
        sock = self.client.socket()
        if sock is not None:  # paho leaves Nagle on: a small frame would wait for the last one's ack
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.loop_start()
        if not self._connected.wait(max(1.0, deadline - time.monotonic())):
            self.close()
            raise PeerError(f"MQTT broker {where} did not answer the connection")
        if self._refused:
            self.close()
            raise PeerError(f"MQTT broker {where} refused {settings.username or 'an anonymous client'}: "
                            f"{self._refused} (check MQTT_USERNAME and MQTT_PASSWORD)")

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
        self._connected.set()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, reasons: Any, _props: Any) -> None:
        self._granted[mid] = list(reasons)
        event = self._subscribed.setdefault(mid, threading.Event())
        event.set()

    def _on_version(self, msg: Any) -> None:
        self.version = msg.payload.decode("utf-8", "replace")[:80]
        self._version_seen.set()

    def subscribe(self, topic: str, timeout: float = 5.0) -> None:
        """Subscribe and wait for the broker's answer; a refusal (the ACL) is one line."""
        rc, mid = self.client.subscribe(topic, self.settings.qos)
        event = self._subscribed.setdefault(mid, threading.Event())
        if rc != 0 or not event.wait(timeout):
            raise PeerError(f"MQTT broker did not confirm the subscription to {topic}")
        if any(getattr(r, "is_failure", False) for r in self._granted.get(mid, [])):
            raise PeerError(f"MQTT broker refused the subscription to {topic} (its ACL)")
        # Mosquitto 2 grants a subscription its ACL forbids and then delivers nothing on it.

    def broker_version(self, timeout: float = 1.0) -> str | None:
        """The broker's $SYS/broker/version, when its ACL lets this client read it."""
        if self.version is None:
            self.client.subscribe("$SYS/broker/version", 0)
            self._version_seen.wait(timeout)
        return self.version

    def round_trip_s(self, samples: int = 5, timeout: float = 1.0) -> float | None:
        """The time through the broker and back: the median of ``samples`` small messages this
        client publishes on a topic of its own and receives (None when none came back)."""
        if not self._echo_subscribed:
            try:
                self.subscribe(self.echo_topic)
            except PeerError:
                return None
            self._echo_subscribed = True
        times = []
        for _ in range(samples):
            started = time.monotonic()
            try:
                self.publish(self.echo_topic, b"x")
                times.append(self._echo.get(timeout=timeout) - started)
            except (ConnectionError, queue.Empty):
                break
        return round(sorted(times)[len(times) // 2], 6) if times else None

    def publish(self, topic: str, data: bytes) -> None:
        info = self.client.publish(topic, data, self.settings.qos)
        if info.rc != 0:
            raise ConnectionError(f"MQTT publish on {topic} failed (paho rc {info.rc}: the broker connection is gone)")

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()


class MqttChannel:
    """One conversation: frames published on ``out``, received from ``inbox`` (fed by the client)."""

    def __init__(self, client: MqttClient, out: str, address: str, own_client: bool) -> None:
        self.client, self.out, self.address, self.own_client = client, out, address, own_client
        self.inbox: queue.Queue = queue.Queue()
        self.heard = threading.Event()  # the first message arrived
        self.closed = False

    def deliver(self, payload: bytes) -> None:
        self.inbox.put(payload if payload else _CLOSED)
        self.heard.set()

    def send_message(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("the MQTT conversation is closed")
        self.client.publish(self.out, data)

    def recv_message(self, timeout: float | None) -> bytes | None:
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no MQTT message in time")
        return None if item is _CLOSED else item

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.client.publish(self.out, b"")
        except ConnectionError:
            pass
        if self.own_client:
            self.client.close()

    def raw_sockets(self) -> list[Any]:
        sock = self.client.client.socket()
        return [sock] if sock is not None else []


def _base(settings: MqttSettings, port: int) -> str:
    return f"{settings.namespace}/p{port}"


def listen(settings: MqttSettings, port: int, timeout: float = 10.0) -> MessageListener:
    """A listener at virtual port ``port`` of the namespace (0: a random one); each conversation
    a dialler opens is offered to the returned listener."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is 0..65535")
    port = port or 20000 + secrets.randbelow(41000)
    base = _base(settings, port)
    channels: dict[str, MqttChannel] = {}
    lock = threading.Lock()
    listener: MessageListener

    def on_message(topic: str, payload: bytes) -> None:
        parts = topic[len(base) + 1:].split("/")
        if len(parts) != 2:
            return
        cid, kind = parts
        with lock:
            channel = channels.get(cid)
            if kind == "open" and channel is None and not listener.closed:
                for done in [c for c, ch in channels.items() if ch.closed]:
                    channels.pop(done, None)
                if len(channels) >= MAX_CONVERSATIONS:  # an authenticated client opening many would hold memory
                    log.warning("MQTT listener at %s: more than %d conversations open; refused %s", base,
                                MAX_CONVERSATIONS, cid[:16])
                    return
                channel = channels[cid] = MqttChannel(client, f"{base}/{cid}/l", settings.host, own_client=False)
                listener.offer(MessageSocket(channel, "mqtt"), f"mqtt:{cid}")
        if kind == "d" and channel is not None:
            channel.deliver(payload)

    client = MqttClient(settings, "paretopipe-listener", on_message, timeout)
    try:
        client.subscribe(f"{base}/+/open")
        client.subscribe(f"{base}/+/d")
    except PeerError:
        client.close()
        raise
    listener = MessageListener((settings.host, port), "mqtt", on_close=client.close)
    return listener


def connect(settings: MqttSettings, port: int, connect_timeout: float) -> MessageSocket:
    """Open a conversation with the listener at ``port``, retrying until ``connect_timeout``."""
    if not 0 < port <= 65535:
        raise UsageError(f"--port {port}: a port is 1..65535")
    base, cid = _base(settings, port), secrets.token_hex(8)
    deadline = time.monotonic() + connect_timeout
    channel: MqttChannel | None = None

    def on_message(topic: str, payload: bytes) -> None:
        if channel is not None and topic == f"{base}/{cid}/l":
            channel.deliver(payload)

    client = MqttClient(settings, "paretopipe-dialler", on_message, connect_timeout)
    channel = MqttChannel(client, f"{base}/{cid}/d", settings.host, own_client=True)
    try:
        client.subscribe(f"{base}/{cid}/l")
        while True:
            client.publish(f"{base}/{cid}/open", b"")
            if channel.heard.wait(OPEN_RETRY_S):
                break
            if time.monotonic() >= deadline:
                raise PeerError(f"no stage listens at {base} on MQTT broker {settings.host}:{settings.port} "
                                f"after {connect_timeout:g}s (is the other stage run with --transport mqtt "
                                f"and the same port and MQTT_NAMESPACE?)")
    except PeerError:
        client.close()
        raise
    except ConnectionError:
        client.close()
        # Mosquitto drops a v3.1.1 client that publishes where its ACL forbids (there is no way to say no).
        raise PeerError(f"MQTT broker {settings.host}:{settings.port} closed the connection of "
                        f"{settings.username or 'an anonymous client'} (does its ACL allow {base}?)")
    return MessageSocket(channel, "mqtt")
