"""The stateful fuzzer of ``test_fuzz_peers.py`` over every message transport: WebSocket, MQTT
through a real Mosquitto broker (the attackers are users of the broker, in the run's namespace,
without the stage secret) and HTTP. A stranger mutating the handshake, an authenticated stage 2
misbehaving in every state and a hostile stage 1 each meet a real stage worker, which then
completes a correct run with the real peer. Below the frames, each protocol's own garbage
(malformed WebSocket frames, malformed HTTP requests, MQTT messages on the run's topics) is
refused and the real peer is still served."""

from __future__ import annotations

import socket
import struct
import time

import paho.mqtt.client as paho
import pytest
from hypothesis import given, settings, strategies as st

from paretopipe.transport import messaging
from paretopipe.transport.messaging.broker import Broker, mosquitto_binary
from fuzz_helpers import (SETTINGS, drain, hostile_stage1_then_the_real_one, hostile_stage2_then_the_real_one,
                          real_run_completes, stage1_worker, stage2_worker, stranger_then_the_real_one)

TRANSPORTS = ["websocket", "mqtt", "http"]
FEW = settings(SETTINGS, max_examples=6)
USERS = ("stage1", "stage2", "hostile")


@pytest.fixture(scope="module")
def broker():
    if mosquitto_binary() is None:
        yield None
        return
    with Broker(users=USERS) as made:
        yield made


def specs(name: str, broker: Broker | None) -> dict[str, messaging.TransportSpec]:
    """Each role's transport: with MQTT each is its own user of the broker."""
    if name != "mqtt":
        return {u: messaging.TransportSpec(name) for u in USERS}
    if broker is None:
        pytest.skip("no mosquitto here (make installs it)")
    return {u: messaging.TransportSpec("mqtt", broker.settings(u)) for u in USERS}


@pytest.fixture(scope="module", params=TRANSPORTS)
def stage1(request, broker):
    """A stage-1 worker listening on the transport, and the real stage 2 reconnecting to it."""
    roles = specs(request.param, broker)
    for worker, port in stage1_worker("none", roles["stage1"], roles["stage2"]):
        yield worker, port, roles, broker


@pytest.fixture(scope="module")
def stage2():
    yield from stage2_worker()


@pytest.mark.slow
@FEW
@given(data=st.data())
def test_strangers_mutating_the_handshake_on_every_transport(stage1, data):
    worker, port, roles, _ = stage1
    stranger_then_the_real_one(worker, port, data, roles["hostile"])


@pytest.mark.slow
@FEW
@given(data=st.data())
def test_an_authenticated_stage2_misbehaving_in_every_state_on_every_transport(stage1, data):
    worker, port, roles, _ = stage1
    hostile_stage2_then_the_real_one(worker, port, data, "none", roles["hostile"])


@pytest.mark.slow
@FEW
@given(data=st.data())
@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_hostile_stage1_on_every_transport(stage2, broker, name, data):
    roles = specs(name, broker)
    hostile_stage1_then_the_real_one(stage2, data, roles["hostile"], roles["stage2"], roles["stage1"])


# -- below the frames: each protocol's own garbage --------------------------------------------------
UPGRADE = (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def _websocket_frame(data) -> bytes:
    """A WebSocket frame with a drawn opcode, mask bit, declared length and payload."""
    opcode = data.draw(st.sampled_from([0x0, 0x1, 0x2, 0x3, 0x8, 0x9, 0xA, 0xF]))
    fin = data.draw(st.booleans())
    masked = data.draw(st.booleans())
    payload = data.draw(st.binary(max_size=200))
    declared = data.draw(st.sampled_from([len(payload), 126, 2**16 - 1, 2**40, 2**63 - 1]))
    head = bytes([(0x80 if fin else 0) | opcode])
    if declared < 126:
        head += bytes([(0x80 if masked else 0) | declared])
    elif declared < 2**16:
        head += bytes([(0x80 if masked else 0) | 126]) + struct.pack("!H", declared)
    else:
        head += bytes([(0x80 if masked else 0) | 127]) + struct.pack("!Q", declared)
    return head + (b"\x01\x02\x03\x04" if masked else b"") + payload


def _http_request(data) -> bytes:
    """A malformed or hostile HTTP request at the data port's paths."""
    method = data.draw(st.sampled_from([b"POST", b"GET", b"PUT", b"\x00\xff", b"POST" * 100]))
    path = data.draw(st.sampled_from([b"/open", b"/c/0/send", b"/c/0/recv", b"/c/../../etc/send", b"/" + b"a" * 9000,
                                      b"*", b"/c/%00/recv"]))
    version = data.draw(st.sampled_from([b"HTTP/1.1", b"HTTP/0.9", b"HTTP/9.9", b""]))
    length = data.draw(st.sampled_from([None, b"-1", b"abc", b"99999999999999999999", b"5", b"0"]))
    headers = b"Host: 127.0.0.1\r\n"
    if length is not None:
        headers += b"Content-Length: " + length + b"\r\n"
    if data.draw(st.booleans()):
        headers += b"Transfer-Encoding: chunked\r\n"
    body = data.draw(st.binary(max_size=200))
    return method + b" " + path + b" " + version + b"\r\n" + headers + b"\r\n" + body


@pytest.mark.slow
@FEW
@given(data=st.data())
def test_each_protocols_own_garbage_is_refused_and_the_real_peer_served(stage1, data):
    worker, port, roles, broker = stage1
    name = roles["stage1"].name
    if name == "mqtt":
        # An authenticated user of the run's namespace publishes garbage where the listener
        # listens: on a fresh conversation's topics, or on its data topic without opening one.
        base = f"{broker.namespace}/p{port}/{data.draw(st.sampled_from(['c0ffee', '../x', 'a' * 300]))}"
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        client.username_pw_set("hostile", broker.passwords["hostile"])
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        try:
            for kind in data.draw(st.lists(st.sampled_from(["open", "d", "l"]), min_size=1, max_size=4)):
                client.publish(f"{base}/{kind}", data.draw(st.binary(max_size=300)), qos=1).wait_for_publish(5)
            time.sleep(0.3)
        finally:
            client.disconnect()
            client.loop_stop()
    else:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            if name == "websocket":
                if data.draw(st.booleans()):
                    s.sendall(UPGRADE)
                    s.recv(4096)  # 101 Switching Protocols
                    s.sendall(_websocket_frame(data))
                else:
                    s.sendall(data.draw(st.binary(min_size=1, max_size=300)))  # no upgrade at all
            else:
                s.sendall(_http_request(data))
            drain(s)
    real_run_completes(worker)
