"""--transport http: the pipeline's frames as HTTP/1.1 bodies on keep-alive connections, real sockets."""

from __future__ import annotations

import http.client
import threading

import pytest
import torch

from paretopipe.errors import PeerError
from paretopipe.transport import messaging, tcp, wire
from tcp_helpers import builder, reference_outputs, run_chain_in_threads, run_in_threads, serve_one_run

HTTP = messaging.TransportSpec("http")


def test_outputs_equal_the_unsplit_model_over_http_pipelined(tmp_path):
    ref = reference_outputs("mobilenetv2", 2, 4)
    s1, s2 = run_in_threads("mobilenetv2", 6, tmp_path, transports=HTTP, batch_size=2, num_batches=3, warmup=1,
                            in_flight=2)
    for got, want in zip(s1.outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    t1, t2 = (m["transport"] for m in s1.record["manifest"]["stages"])
    assert t1["transport"] == t2["transport"] == "http"
    # Stage 2 posts each result and keeps a poll open: its socket bytes carry the headers of both.
    assert t2["messages_sent"] >= 3 and t2["socket_bytes_sent"] > t2["bytes_sent"] + 3 * 100


def test_a_three_stage_chain_over_http_computes_the_model_both_ways(tmp_path):
    ref = reference_outputs("mobilenetv2", 1, 3)
    out = run_chain_in_threads("mobilenetv2", [3, 9], tmp_path, transports=HTTP, batch_size=1, num_batches=2,
                               warmup=1)
    assert not {k for k in out if k.endswith("_error")}, out
    for got, want in zip(out["stage1"].outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert [m["transport"]["transport"] for m in out["stage1"].record["manifest"]["stages"]] == ["http"] * 3


def test_an_oversized_body_and_garbage_are_refused_and_the_real_peer_is_served(tmp_path):
    b = builder("mobilenetv2")
    listener = tcp.StageListener(messaging.listen(HTTP, "127.0.0.1", 0, 1 << 20), tcp.identity_of(b), max_payload=1 << 20)
    try:
        big = http.client.HTTPConnection("127.0.0.1", listener.port, timeout=10)
        big.request("POST", "/open", body=b"")
        cid = big.getresponse().read().decode()
        big.putrequest("POST", f"/c/{cid}/send")
        big.putheader("Content-Length", str(3 << 20))  # over 1 MiB + headroom: refused before it is read
        big.endheaders()
        answer = big.getresponse()
        assert answer.status == 413 and answer.getheader("Connection") == "close"
        big.close()
        for path, code in (("/c/nosuch/send", 404), ("/elsewhere", 404)):
            other = http.client.HTTPConnection("127.0.0.1", listener.port, timeout=10)
            other.request("POST", path, body=b"x")
            assert other.getresponse().status == code
            other.close()
        garbage = http.client.HTTPConnection("127.0.0.1", listener.port, timeout=10)
        garbage.request("POST", "/open", body=b"")
        gid = garbage.getresponse().read().decode()
        garbage.request("POST", f"/c/{gid}/send", body=b"GET / HTTP/1.1\r\n" * 16)
        assert garbage.getresponse().status == 204  # accepted as bytes, refused by the frame checks
        s1, s2 = serve_one_run(listener, HTTP, tmp_path)
        assert s1.record["status"] == "complete" and s2.record["status"] == "complete"
        assert any("magic" in r for r in listener.refusals), listener.refusals
    finally:
        listener.close()


def test_dialling_a_tcp_stage_with_http_says_what_to_check():
    sock = tcp.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]

    def answer():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            try:
                wire.send_frame(conn, wire.CHALLENGE, meta={"nonce": "x"})  # a TCP stage's first words
            finally:
                conn.close()
    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(PeerError, match="could not open an HTTP conversation .*--transport http"):
            messaging.connect(HTTP, "127.0.0.1", port, 1, 1 << 20)
    finally:
        sock.close()


def test_a_client_opening_conversations_without_end_is_refused_beyond_the_bound():
    from paretopipe.transport.messaging.http import MAX_CONVERSATIONS

    listener = messaging.listen(HTTP, "127.0.0.1", 0, 1 << 20)  # no handshake to close what it is offered
    try:
        conn = http.client.HTTPConnection("127.0.0.1", listener.getsockname()[1], timeout=10)
        codes = []
        for _ in range(MAX_CONVERSATIONS + 2):
            conn.request("POST", "/open", body=b"")
            answer = conn.getresponse()
            answer.read()
            codes.append(answer.status)
        assert codes == [200] * MAX_CONVERSATIONS + [503, 503]
        conn.close()
    finally:
        listener.close()
