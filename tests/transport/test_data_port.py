"""The data port under attack: authentication, strangers that cannot hold or crash the listener, and
the attack table's rows, each refused while the real peer is still served."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import pytest
import torch

from paretopipe.errors import PeerError, WireError
from paretopipe.transport import tcp, wire
from paretopipe.transport.runconfig import RunConfig
from tcp_helpers import builder, run_in_threads

SECRET = b"s3cret-for-tests-0123456789"
MODEL = "resnet18"


def _real_run(tmp, secret=SECRET):
    """The real pair completes a run: the proof that the listener and the peer survived."""
    s1, s2 = run_in_threads(MODEL, 9, tmp, secret=secret, batch_size=1, num_batches=2, warmup=0)
    assert s1.record["status"] == s2.record["status"] == "complete"
    return s1


@pytest.fixture
def listener():
    b = builder(MODEL)
    lst = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), SECRET, handshake_timeout=2.0)
    yield lst
    lst.close()


def _connect(lst) -> socket.socket:
    return socket.create_connection(("127.0.0.1", lst.port), timeout=5)


def test_secrets_are_checked_both_ways_and_never_sent(tmp_path, listener):
    b = builder(MODEL)
    with pytest.raises(PeerError, match="authentication failed: stage 2 does not know the shared secret"):
        tcp.open_connection(_connect(listener), b, secret=b"another-secret-0123456789")
    with pytest.raises(PeerError, match="authentication required"):
        tcp.open_connection(_connect(listener), b, secret=None)
    plain = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), None)
    try:
        with pytest.raises(PeerError, match="stage 1 does not authenticate"):
            tcp.open_connection(socket.create_connection(("127.0.0.1", plain.port)), b, secret=SECRET)
    finally:
        plain.close()
    # A correct peer authenticates, and the secret itself never appears on the wire.
    a, c = socket.socketpair()
    seen = bytearray()

    def relay():  # stage 2 (a) <-> c <-> the listener, recording what stage 2 sends
        upstream = _connect(listener)
        wire.send_encoded(c, wire.frame(*_fields(wire.recv_frame(upstream, wire.MAX_META_BYTES))))
        hello = wire.recv_frame(c, wire.MAX_META_BYTES)
        seen.extend(repr(hello.meta).encode())
        wire.send_encoded(upstream, wire.frame(*_fields(hello)))
        wire.send_encoded(c, wire.frame(*_fields(wire.recv_frame(upstream, wire.MAX_META_BYTES))))

    th = threading.Thread(target=relay, daemon=True)
    th.start()
    tcp.open_connection(a, b, secret=SECRET)
    assert SECRET not in seen and b"mac" in seen
    _real_run(tmp_path / "real")


def _fields(f):
    return f.kind, f.seq, None, f.meta


def test_no_secret_beyond_loopback_warns(caplog):
    b = builder(MODEL)
    with caplog.at_level(logging.WARNING, logger="paretopipe.tcp"):
        lst = tcp.StageListener(tcp.listen("0.0.0.0", 0), tcp.identity_of(b), None)
        lst.close()
    assert any("without a shared secret" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paretopipe.tcp"):
        tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), None).close()
    # Only this warning: the logger may carry another test's listener thread, still winding down.
    assert not [r for r in caplog.records if "without a shared secret" in r.getMessage()]


def _hello(b, **over):
    hello = {**tcp.identity_of(b), "nonce": "00" * 16, "cuts": None}
    hello.update(over)
    return hello


@pytest.mark.parametrize("attack", [
    "shape-overflow", "deep-meta", "long-number", "not-json", "http", "wrong-types", "unknown-key",
    "wrong-model", "bad-mac"])
def test_hostile_hellos_are_refused_and_the_listener_lives(tmp_path, listener, attack):
    b = builder(MODEL)
    with _connect(listener) as s:
        wire.recv_frame(s, wire.MAX_META_BYTES)  # the challenge
        if attack == "shape-overflow":  # row 1: float32 (2^62, 2^62, 0), 0 payload bytes
            s.sendall(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.HELLO, 1, 1, 0, 0, 3, 0, 0, 0, 0,
                                       2**62, 2**62, 0, 0, 0, 0, 0, 0))
        elif attack in ("deep-meta", "long-number", "not-json"):  # row 2
            meta = {"deep-meta": b"[" * 60000, "long-number": b'{"n": ' + b"9" * 5000 + b"}",
                    "not-json": b"\xff\xfe"}[attack]
            s.sendall(wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.HELLO, 0, 0, 0, 0, 0, len(meta), 0, 0, 0,
                                       *([0] * 8)) + meta)
        elif attack == "http":
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(200))
        else:
            meta = {"wrong-types": _hello(b, num_classes="10", cuts="abc"),
                    "unknown-key": {**_hello(b), "run_id": "../x"},
                    "wrong-model": _hello(b, model="vgg16"),
                    "bad-mac": _hello(b, mac="ab" * 32)}[attack]
            wire.send_frame(s, wire.HELLO, meta=meta)
        try:
            reply = wire.recv_frame(s, wire.MAX_META_BYTES, deadline=time.monotonic() + 5)
            assert reply.kind == wire.ERROR
        except PeerError:
            pass  # closed without a word: as good a refusal
    deadline = time.monotonic() + 3
    while not listener.refusals and time.monotonic() < deadline:  # logged right after the refusal is sent
        time.sleep(0.05)
    assert listener.refusals, "the stranger was refused and logged"
    connection = tcp.open_connection(_connect(listener), b, secret=SECRET)  # the real peer still gets in
    connection.close()
    _real_run(tmp_path)


@pytest.mark.slow
def test_slow_silent_and_flooding_strangers_cannot_delay_the_real_peer(tmp_path, listener):
    """Row 3: one byte every 0.5 s; 40 silent connections; 200 connect-and-close: the real peer's
    handshake still completes at once, and every stranger is dropped by the handshake deadline."""
    strangers = [_connect(listener) for _ in range(40)]
    dripper = _connect(listener)
    stop = threading.Event()

    def drip():
        data = b"".join(bytes(memoryview(x)) for x in wire.encode(wire.HELLO, 0, meta={"x": "y" * 50}).buffers)
        for byte in data:
            if stop.is_set():
                return
            try:
                dripper.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.5)

    threading.Thread(target=drip, daemon=True).start()
    for _ in range(200):
        socket.create_connection(("127.0.0.1", listener.port)).close()
    t0 = time.monotonic()
    connection = tcp.open_connection(_connect(listener), builder(MODEL), secret=SECRET)
    assert time.monotonic() - t0 < 2.0
    connection.close()
    time.sleep(2.5)  # the handshake deadline (2 s here) has passed for every stranger
    for s in strangers + [dripper]:
        s.settimeout(1)
        try:
            rest = s.recv(4096)  # the challenge, then end of stream
            while rest:
                rest = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            pass
        s.close()
    stop.set()
    _real_run(tmp_path)


def _fake_stage1(run_meta: dict, then=None):
    """A stage 1 that completes the handshake and then sends ``run_meta`` as its RUN."""
    srv = socket.create_server(("127.0.0.1", 0))
    result: dict = {}

    def serve():
        conn, _ = srv.accept()
        with conn:
            wire.send_frame(conn, wire.CHALLENGE, meta={"nonce": "11" * 16, "auth": False})
            wire.recv_frame(conn, wire.MAX_META_BYTES)
            wire.send_frame(conn, wire.HELLO_OK)
            wire.send_frame(conn, wire.RUN, meta=run_meta)
            try:
                result["reply"] = wire.recv_frame(conn, wire.MAX_META_BYTES, deadline=time.monotonic() + 10)
                if then is not None:
                    then(conn)
            except PeerError:
                pass

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return srv, th, result


@pytest.mark.parametrize("run_id", ["../../../../tmp/pp-escape", "/tmp/pp-abs", "..", "a/b", "x" * 500])
def test_a_peers_run_id_never_becomes_a_path(tmp_path, run_id):
    """Row 4: stage 2 writes its record inside --out, whatever run id stage 1 claims."""
    b = builder(MODEL)
    cfg = RunConfig(model=b.name, cuts=[b.cuts_for(9)[0]], batch_size=1, num_batches=1, warmup=0).to_dict()
    srv, th, result = _fake_stage1({"run_id": run_id, "config": cfg, "link": {"mode": "none"}})
    connection = tcp.open_connection(socket.create_connection(srv.getsockname()), b)
    with pytest.raises(WireError, match="not a safe file name"):
        tcp.serve_connection(connection, b, output_dir=tmp_path / "out")
    th.join(10)
    srv.close()
    assert result["reply"].kind == wire.ERROR and "cannot run this" in result["reply"].meta["reason"]
    assert not (tmp_path / "out").exists() and not list(tmp_path.parent.glob("pp-escape*"))


@pytest.mark.parametrize("meta, match", [
    ({"config": {}, "link": {}}, "missing key 'run_id'"),
    ({"run_id": "r1", "config": {"model": "resnet18"}, "link": {}}, "missing key 'cuts'"),
    ({"run_id": "r1", "config": {"model": "resnet18", "cuts": ["nope"]}, "link": {}}, "unknown cut 'nope'"),
    ({"run_id": "r1", "config": {"model": "resnet18", "cuts": ["output"], "batch_size": -1}, "link": {}},
     "must be at least 1"),
])
def test_malformed_runs_are_one_clear_refusal(meta, match):
    """Row 5: a RUN without its fields is refused in one line, not a KeyError."""
    b = builder(MODEL)
    srv, th, result = _fake_stage1(meta)
    connection = tcp.open_connection(socket.create_connection(srv.getsockname()), b)
    with pytest.raises(WireError, match=match):
        tcp.serve_connection(connection, b, output_dir=None)
    th.join(10)
    srv.close()
    assert result["reply"].kind == wire.ERROR


def test_bogus_records_from_stage_2_still_leave_stage_1_a_record(tmp_path, listener):
    """Row 5: a peer's RECORDS {"x": 1}: stage 1 writes its record all the same (without the peer's part)."""
    b = builder(MODEL)
    cfg = RunConfig(model=b.name, cuts=b.cuts_for(9), batch_size=1, num_batches=2, warmup=0, timeout_s=20)

    def fake_stage2():
        sock = _connect(listener)
        connection = tcp.open_connection(sock, b, secret=SECRET)
        wire.expect(connection.reader.read(), wire.RUN)
        connection.send(wire.RUN_OK)
        for _ in range(2):
            f = wire.expect(connection.reader.read(), wire.TENSOR)
            connection.send(wire.RESULT, f.seq, torch.zeros(1, 10), meta={"stage2_compute_s": 0.001})
        wire.expect(connection.reader.read(), wire.RECORDS)
        connection.send_json(wire.RECORDS, {"x": 1})
        time.sleep(0.5)
        connection.close()

    th = threading.Thread(target=fake_stage2, daemon=True)
    th.start()
    outcome = tcp.run_stage1(listener, b, cfg, connect_timeout=10, output_dir=tmp_path)
    th.join(10)
    assert outcome.path.is_file() and outcome.record["status"] == "complete"
    assert [m["role"] for m in outcome.record["manifest"]["stages"]] == ["stage1"]


def test_lying_result_durations_are_refused(tmp_path, listener):
    b = builder(MODEL)
    cfg = RunConfig(model=b.name, cuts=b.cuts_for(9), batch_size=1, num_batches=2, warmup=0, timeout_s=20)

    def fake_stage2():
        connection = tcp.open_connection(_connect(listener), b, secret=SECRET)
        wire.expect(connection.reader.read(), wire.RUN)
        connection.send(wire.RUN_OK)
        f = wire.expect(connection.reader.read(), wire.TENSOR)
        connection.send(wire.RESULT, f.seq, torch.zeros(1, 10), meta={"stage2_compute_s": "soon"})
        time.sleep(1)
        connection.close()

    threading.Thread(target=fake_stage2, daemon=True).start()
    with pytest.raises(WireError, match="stage2_compute_s='soon' is not a duration"):
        tcp.run_stage1(listener, b, cfg, connect_timeout=10, output_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")  # the incomplete record is still written
    assert path.read_text().count('"status": "incomplete"') == 1
    struct.calcsize("<q")


def test_segment_times_from_stage_2_are_checked_before_the_policy_sees_them():
    """An adaptive stage 2 reports its per-segment compute with each result; what does not fit the
    run's segments, or is not a duration, is refused by name (stage 1 then ignores it and goes on)."""
    from paretopipe.errors import WireError
    from paretopipe.transport.tcp.messages import read_segment_times

    assert read_segment_times({}, 19) == (0, [])
    assert read_segment_times({"stage2_segment_first": 17, "stage2_segment_s": [0.001, 0.002]}, 19) == \
        (17, [0.001, 0.002])
    for meta in ({"stage2_segment_first": 18, "stage2_segment_s": [0.1, 0.1]},       # past the last segment
                 {"stage2_segment_first": -1, "stage2_segment_s": [0.1]},
                 {"stage2_segment_first": True, "stage2_segment_s": [0.1]},
                 {"stage2_segment_first": 0, "stage2_segment_s": "0.1"},
                 {"stage2_segment_first": 0},
                 {"stage2_segment_first": 0, "stage2_segment_s": [None]},
                 {"stage2_segment_first": 0, "stage2_segment_s": [-1.0]},
                 {"stage2_segment_first": 0, "stage2_segment_s": [0.1] * 5000}):
        with pytest.raises(WireError):
            read_segment_times(meta, 19)
