"""--transport websocket: the pipeline's frames as binary WebSocket messages, on real sockets."""

from __future__ import annotations

import threading

import pytest
import torch
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from paretopipe.transport import messaging, tcp, wire
from tcp_helpers import builder, reference_outputs, run_chain_in_threads, run_in_threads, serve_one_run

WS = messaging.TransportSpec("websocket")
SECRET = b"websocket-test-secret-0123456789"


def test_outputs_equal_the_unsplit_model_over_websocket_sealed_and_pipelined(tmp_path):
    ref = reference_outputs("mobilenetv2", 2, 4)
    s1, s2 = run_in_threads("mobilenetv2", 6, tmp_path, transports=WS, secret=SECRET, encrypt="chacha20",
                            batch_size=2, num_batches=3, warmup=1, in_flight=2)
    for got, want in zip(s1.outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    t1, t2 = (m["transport"] for m in s1.record["manifest"]["stages"])
    assert t1["transport"] == t2["transport"] == "websocket"
    # Every tensor frame and the records crossed as messages; the socket carried them and framing.
    assert t1["messages_sent"] >= 4 and t1["bytes_sent"] >= sum(b["wire_bytes"] for b in s1.record["batches"])
    assert t1["socket_bytes_sent"] > t1["bytes_sent"]
    assert 0 < t2["connect_s"] < 10 and 0 < t1["handshake_s"] < 5 and 0 < t2["handshake_s"] < 5
    assert s1.record["manifest"]["stages"][0]["cipher"]["cipher"] == "chacha20"


def test_a_three_stage_chain_over_websocket_computes_the_model_both_ways(tmp_path):
    ref = reference_outputs("mobilenetv2", 1, 3)
    out = run_chain_in_threads("mobilenetv2", [3, 9], tmp_path, transports=WS, batch_size=1, num_batches=2,
                               warmup=1)
    assert not {k for k in out if k.endswith("_error")}, out
    for got, want in zip(out["stage1"].outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert [m["transport"]["transport"] for m in out["stage1"].record["manifest"]["stages"]] == ["websocket"] * 3


def test_a_text_an_oversized_and_a_garbage_message_are_refused_and_the_real_peer_is_served(tmp_path):
    b = builder("mobilenetv2")
    listener = tcp.StageListener(messaging.listen(WS, "127.0.0.1", 0, 1 << 20), tcp.identity_of(b), max_payload=1 << 20)
    url = f"ws://127.0.0.1:{listener.port}/"
    try:
        with ws_connect(url, proxy=None) as text_peer:
            text_peer.send("hello")  # not binary
            with pytest.raises(ConnectionClosed):
                while True:
                    text_peer.recv(timeout=5)
        with ws_connect(url, proxy=None, max_size=None) as big_peer:
            big_peer.recv(timeout=5)  # the CHALLENGE
            big_peer.send(b"\0" * (3 << 20))  # over the limit of 1 MiB + headroom
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    big_peer.recv(timeout=5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        with ws_connect(url, proxy=None) as garbage_peer:
            garbage_peer.recv(timeout=5)
            garbage_peer.send(b"GET / HTTP/1.1\r\n" * 16)
            with pytest.raises(ConnectionClosed):
                while True:
                    garbage_peer.recv(timeout=5)
        # The real stage 2 still gets in and a run completes.
        s1, s2 = serve_one_run(listener, WS, tmp_path)
        assert s1.record["status"] == "complete" and s2.record["status"] == "complete"
        assert len(listener.refusals) >= 2
        assert any("magic" in r or "frame" in r for r in listener.refusals), listener.refusals
    finally:
        listener.close()


def test_dialling_a_tcp_port_with_websocket_says_what_to_check(tmp_path):
    sock = tcp.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]

    def answer():
        conn, _ = sock.accept()
        wire.send_frame(conn, wire.CHALLENGE, meta={"nonce": "x"})  # a TCP stage's first words
        conn.close()
    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(Exception, match="did not open a WebSocket.*--transport websocket"):
            messaging.connect(WS, "127.0.0.1", port, 5, 1 << 20)
    finally:
        sock.close()
