"""--transport mqtt: the pipeline's frames through a real Mosquitto broker that each test module
starts (and removes), with its password file and ACL."""

from __future__ import annotations

import random
import threading
import time

import paho.mqtt.client as paho
import pytest
import torch

from paretopipe.errors import PeerError
from paretopipe.transport import messaging, tcp
from paretopipe.transport.messaging.broker import Broker, mosquitto_binary
from paretopipe.transport.messaging.mqtt import MqttSettings
from tcp_helpers import builder, reference_outputs, run_chain_in_threads, run_in_threads, serve_one_run

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="no mosquitto here (make installs it)")


@pytest.fixture(scope="module")
def broker():
    with Broker(users=("stage1", "stage2", "stage3"), others={"other-run": "paretopipe/other-run"}) as b:
        yield b


def _spec(broker: Broker, user: str, qos: int = 0) -> messaging.TransportSpec:
    return messaging.TransportSpec("mqtt", broker.settings(user, qos))


@pytest.mark.parametrize("qos", [0, 1])
def test_outputs_equal_the_unsplit_model_through_the_broker(broker, tmp_path, qos):
    ref = reference_outputs("mobilenetv2", 2, 4)
    s1, s2 = run_in_threads("mobilenetv2", 6, tmp_path, transports=[_spec(broker, "stage1", qos),
                                                                    _spec(broker, "stage2", qos)],
                            batch_size=2, num_batches=3, warmup=1, in_flight=2)
    for got, want in zip(s1.outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    t1, t2 = (m["transport"] for m in s1.record["manifest"]["stages"])
    assert t1["transport"] == t2["transport"] == "mqtt"
    assert t1["qos"] == t2["qos"] == qos and t1["broker"] == f"127.0.0.1:{broker.port}"
    assert t1["broker_version"].startswith("mosquitto version")
    assert (t1["username"], t2["username"]) == ("stage1", "stage2")
    # The time through the broker and back, and what opening the conversation and the handshake took.
    assert 0 < t1["broker_round_trip_s"] < 1 and 0 < t2["broker_round_trip_s"] < 1
    assert 0 < t2["connect_s"] < 10 and "connect_s" not in t1  # the dialler opens; the listener is offered
    assert 0 < t1["handshake_s"] < 5 and 0 < t2["handshake_s"] < 5
    assert "password" not in str(s1.record)


def test_a_three_stage_chain_through_the_broker_computes_the_model_both_ways(broker, tmp_path):
    ref = reference_outputs("mobilenetv2", 1, 3)
    out = run_chain_in_threads("mobilenetv2", [3, 9], tmp_path, batch_size=1, num_batches=2, warmup=1,
                               transports=[_spec(broker, f"stage{j}") for j in (1, 2, 3)])
    assert not {k for k in out if k.endswith("_error")}, out
    for got, want in zip(out["stage1"].outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert [m["transport"]["transport"] for m in out["stage1"].record["manifest"]["stages"]] == ["mqtt"] * 3


def test_without_credentials_or_outside_the_run_a_client_cannot_reach_the_runs_topics(broker, tmp_path):
    with pytest.raises(PeerError, match="refused an anonymous client"):
        messaging.connect(messaging.TransportSpec("mqtt", MqttSettings("127.0.0.1", broker.port,
                                                                        namespace=broker.namespace)),
                          "127.0.0.1", 5000, 2, 1 << 20)
    wrong = MqttSettings("127.0.0.1", broker.port, "stage2", "not-the-password", broker.namespace)
    with pytest.raises(PeerError, match="refused stage2"):
        messaging.connect(messaging.TransportSpec("mqtt", wrong), "127.0.0.1", 5000, 2, 1 << 20)
    # Another run's user, confined by the ACL to its own namespace, publishes on this run's topics.
    b = builder("mobilenetv2")
    listener = tcp.StageListener(messaging.listen(_spec(broker, "stage1"), "127.0.0.1", 0, 1 << 20), tcp.identity_of(b))
    intruder = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    intruder.username_pw_set("other-run", broker.passwords["other-run"])
    intruder.connect("127.0.0.1", broker.port)
    intruder.loop_start()
    try:
        base = f"{broker.namespace}/p{listener.port}/intruder"
        intruder.publish(f"{base}/open", b"", qos=0)
        deadline = time.monotonic() + 5
        while intruder.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not intruder.is_connected()  # Mosquitto drops a v3.1.1 client that publishes outside its ACL
        assert listener.refusals == []  # ...and the listener never saw a connection
        # Through the transport, the same user gets one line, not a hang.
        with pytest.raises(PeerError, match="closed the connection of other-run"):
            messaging.connect(messaging.TransportSpec("mqtt", MqttSettings(
                "127.0.0.1", broker.port, "other-run", broker.passwords["other-run"], broker.namespace)),
                "127.0.0.1", listener.port, 3, 1 << 20)
        # The run's own stages are still served.
        s1, s2 = run_in_threads("mobilenetv2", 6, tmp_path, transports=[_spec(broker, "stage1"),
                                                                        _spec(broker, "stage2")],
                                batch_size=1, num_batches=1, warmup=0)
        assert s1.record["status"] == s2.record["status"] == "complete"
    finally:
        intruder.loop_stop()
        intruder.disconnect()
        listener.close()


def test_garbage_from_an_authenticated_client_is_refused_and_the_real_peer_is_served(broker, tmp_path):
    b = builder("mobilenetv2")
    listener = tcp.StageListener(messaging.listen(_spec(broker, "stage1"), "127.0.0.1", 0, 1 << 20), tcp.identity_of(b))
    hostile = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    hostile.username_pw_set("stage2", broker.passwords["stage2"])
    hostile.connect("127.0.0.1", broker.port)
    hostile.loop_start()
    try:
        base = f"{broker.namespace}/p{listener.port}/hostile"
        hostile.publish(f"{base}/open", b"", qos=1).wait_for_publish(5)
        hostile.publish(f"{base}/d", b"GET / HTTP/1.1\r\n" * 16, qos=1).wait_for_publish(5)
        deadline = time.monotonic() + 10
        while not listener.refusals and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.refusals and "magic" in listener.refusals[0]
        s1, s2 = serve_one_run(listener, _spec(broker, "stage2"), tmp_path)
        assert s1.record["status"] == "complete" and s2.record["status"] == "complete"
    finally:
        hostile.loop_stop()
        hostile.disconnect()
        listener.close()


def test_no_listener_at_the_port_is_one_line_naming_what_to_check(broker):
    t0 = time.monotonic()
    with pytest.raises(PeerError, match="no stage listens at .* after 1s .*--transport mqtt"):
        messaging.connect(_spec(broker, "stage2"), "127.0.0.1", 6553, 1, 1 << 20)
    assert time.monotonic() - t0 < 10


def test_two_diallers_of_a_program_that_seeds_random_alike_keep_their_own_conversations(broker):
    """Client ids and conversation ids come from the OS: with the random module's, a program that
    seeds it (hypothesis does, per example) gave two clients one id, and the broker dropped the first."""
    listener = messaging.listen(_spec(broker, "stage1"), "127.0.0.1", 0, 1 << 20)
    port = listener.getsockname()[1]
    listener.settimeout(10)
    opened = []
    try:
        accepted = []
        for _ in range(2):
            random.seed(7)
            # The dialler's connect returns once the listening side speaks (a stage's challenge).
            dialling = threading.Thread(target=lambda: opened.append(
                messaging.connect(_spec(broker, "stage2"), "127.0.0.1", port, 5, 1 << 20)))
            dialling.start()
            accepted.append(listener.accept()[0])
            accepted[-1].sendall(b"challenge")
            dialling.join(10)
        assert len(opened) == 2
        for i, (dialler, served) in enumerate(zip(opened, accepted)):
            dialler.settimeout(5)
            assert dialler.recv(100) == b"challenge"
            dialler.sendall(f"hello {i}".encode())
            served.settimeout(5)
            assert served.recv(100) == f"hello {i}".encode()
    finally:
        for s in opened:
            s.close()
        listener.close()
