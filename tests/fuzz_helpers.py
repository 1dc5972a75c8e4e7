"""What the stateful fuzzers share (``tests/transport/test_fuzz_peers.py`` attacks the TCP port,
``tests/transport/test_fuzz_transports.py`` the message transports): mutated messages, almost-frames,
the legitimate stage 2 and a hostile one, each over any transport."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from typing import Any, Iterator

import torch
from hypothesis import HealthCheck, settings, strategies as st

from paretopipe.errors import ParetoPipeError, PeerError
from paretopipe.controller.hosts import StageProcess
from paretopipe.transport import auth, messaging, tcp, wire
from paretopipe.transport.runconfig import DEFAULT_MAX_PAYLOAD as MAX_PAYLOAD, RunConfig
from conftest import PYTHON
from tcp_helpers import builder

TCP = messaging.TransportSpec("tcp")

SECRET = "fuzz-secret-0123456789abcdef"
MODEL = "resnet18"
SETTINGS = settings(max_examples=18, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

WEIRD = st.sampled_from([None, True, -1, 2**70, 1e308, "x" * 5000, [[[[]]]], {"a": {"b": {}}}, "", "../../etc"])


def mutate(meta: dict, data) -> dict:
    """Drop, add or replace one key of a message."""
    meta = dict(meta)
    how = data.draw(st.sampled_from(["drop", "add", "replace"]))
    keys = sorted(meta)
    if how == "drop" and keys:
        meta.pop(data.draw(st.sampled_from(keys)))
    elif how == "add" or not keys:
        meta[data.draw(st.sampled_from(["extra", "run_id", "__class__", "mac"]))] = data.draw(WEIRD)
    else:
        meta[data.draw(st.sampled_from(keys))] = data.draw(WEIRD)
    return meta


def raw(kind: int, meta: dict | None = None, tensor: torch.Tensor | None = None, seq: int = 0) -> bytes:
    return b"".join(bytes(memoryview(b)) for b in wire.encode(kind, seq, tensor, meta).buffers)


def garbage(data) -> bytes:
    """Bytes that are almost a frame: random, truncated or with one byte flipped."""
    good = raw(wire.RESULT, {"stage2_compute_s": 0.001}, torch.zeros(1, 10))
    how = data.draw(st.sampled_from(["random", "truncated", "flipped", "kind"]))
    if how == "random":
        return data.draw(st.binary(min_size=1, max_size=300))
    if how == "truncated":
        return good[:data.draw(st.integers(1, len(good) - 1))]
    if how == "kind":
        return good[:5] + bytes([data.draw(st.integers(12, 255))]) + good[6:]
    pos = data.draw(st.integers(0, len(good) - 1))
    return good[:pos] + bytes([good[pos] ^ 0xFF]) + good[pos + 1:]


def drain(sock: socket.socket, seconds: float = 3.0) -> None:
    """Read until the peer closes (or the time is up): the refusal must end the connection."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def cfg(b, batches: int = 2) -> dict:
    return RunConfig(model=b.name, cuts=b.cuts_for(9), batch_size=1, num_batches=batches, warmup=0,
                     timeout_s=10).to_dict()


class RealStage2:
    """The legitimate stage 2, in this process: it (re)connects whenever its connection ends."""

    def __init__(self, port: int, encrypt: str = "none", spec: messaging.TransportSpec = TCP) -> None:
        self.port, self.encrypt, self.spec, self.stop = port, encrypt, spec, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        b = builder(MODEL)
        while not self.stop.is_set():
            try:
                sock = messaging.connect(self.spec, "127.0.0.1", self.port, 5, MAX_PAYLOAD)
                connection = tcp.open_connection(sock, b, secret=SECRET.encode(), encrypt=self.encrypt)
                tcp.serve_connection(connection, b, timeout_s=10)
            except (ParetoPipeError, OSError):
                time.sleep(0.1)


def dial(spec: messaging.TransportSpec, port: int) -> Any:
    """A connection to the stage listening at ``port`` over ``spec``'s transport (TCP: a plain
    socket with a 5 s timeout, as the TCP fuzzer always used)."""
    if spec.name == "tcp":
        return socket.create_connection(("127.0.0.1", port), timeout=5)
    sock = messaging.connect(spec, "127.0.0.1", port, 5, MAX_PAYLOAD)
    sock.settimeout(5)
    return sock


class HostileStage2:
    """Authenticates with the secret, then misbehaves at one point of the run. Everything it will
    send is drawn up front: hypothesis draws belong to the test's own thread. On a sealed port its
    mutated messages are sealed as the protocol requires (an insider holding the key), while its
    garbage goes on the wire as it is (an outsider's injected bytes)."""

    def __init__(self, port: int, data, encrypt: str = "none", spec: messaging.TransportSpec = TCP) -> None:
        self.state = data.draw(st.sampled_from(["run_ok", "result", "records"]))
        self.how = data.draw(st.sampled_from(["mutated", "garbage", "close"]))
        self.garbage = garbage(data)
        self.run_ok = wire.encode(wire.RUN_OK, 0, None, mutate({"ok": True}, data))
        self.result = wire.encode(wire.RESULT, data.draw(st.sampled_from([1, 0, 99, 65535])), torch.zeros(1, 10),
                                  mutate({"stage2_compute_s": 0.001, "stage2_queue_s": 0.0}, data))
        part = {"manifest": {"role": "stage2"}, "sysmon": {"cpu_percent_mean": 1.0}}
        self.records = mutate(part, data)
        b = builder(MODEL)
        self.connection = tcp.open_connection(dial(spec, port), b, secret=SECRET.encode(), encrypt=encrypt)
        self.thread = threading.Thread(target=self._play, daemon=True)
        self.thread.start()

    def _misbehave(self, mutated: wire.Encoded | None) -> None:
        if self.how == "close":
            self.connection.close()
        elif self.how == "mutated" and mutated is not None:
            self.connection.writer.send(mutated)
        else:
            self.connection.sock.sendall(self.garbage)

    def _play(self) -> None:
        s = self.connection
        try:
            wire.expect(s.reader.read(), wire.RUN)
            if self.state == "run_ok":
                return self._misbehave(self.run_ok)
            s.send(wire.RUN_OK)
            for i in range(2):
                f = wire.expect(s.reader.read(), wire.TENSOR)
                if self.state == "result" and i == 1:
                    return self._misbehave(self.result)
                s.send(wire.RESULT, f.seq, torch.zeros(1, 10), meta={"stage2_compute_s": 0.001})
            wire.expect(s.reader.read(), wire.RECORDS)
            if self.how == "mutated":
                s.send_json(wire.RECORDS, self.records)
            else:
                self._misbehave(None)
        except (ParetoPipeError, OSError):
            pass
        finally:
            time.sleep(0.2)
            s.close()


def transport_fields(spec: messaging.TransportSpec) -> dict[str, Any]:
    """A worker command's transport fields (MQTT: the settings of the user it connects as)."""
    if spec.name == "tcp":
        return {}
    return {"transport": spec.name, "mqtt": dataclasses.asdict(spec.mqtt) if spec.mqtt else None}


def hostile_stage1(data, spec: messaging.TransportSpec = TCP) -> tuple[Any, int, threading.Thread]:
    """A stage 1 listening on ``spec``'s transport that misbehaves at one drawn state of the
    handshake or the run; (its listener, its port, the thread that plays it)."""
    b = builder(MODEL)
    srv = socket.create_server(("127.0.0.1", 0)) if spec.name == "tcp" else messaging.listen(spec, "127.0.0.1", 0,
                                                                                             MAX_PAYLOAD)
    state = data.draw(st.sampled_from(["challenge", "hello_ok", "run", "tensor", "records"]))
    how = data.draw(st.sampled_from(["mutated", "garbage", "close"]))
    run_meta = {"run_id": "fuzz-run", "config": cfg(b), "link": {"mode": "none"}, "return_link": None}
    junk = garbage(data)
    mutations = {name: mutate(meta, data) for name, meta in (
        ("challenge", {"nonce": "33" * 16, "auth": True}), ("hello_ok", {"mac": "00" * 32}), ("run", run_meta))}
    x = builder(MODEL).stage(run_meta["config"]["cuts"], 0)(torch.randn(1, 3, 224, 224))

    def play():
        srv.settimeout(30)
        try:
            conn, _ = srv.accept()
        except OSError:
            srv.close()
            return
        with conn:
            try:
                def step(name: str, kind: int, meta: dict | None, tensor=None, seq=0) -> bool:
                    if state != name:
                        wire.send_frame(conn, kind, seq, tensor, meta)
                        return False
                    if how == "mutated" and name in mutations:
                        conn.sendall(raw(kind, mutations[name], tensor, seq))
                    elif how == "mutated":  # a tensor that fits no stage, under a sequence number out of range
                        conn.sendall(raw(kind, {"x": 1}, torch.randn(1, 3, 4, 4), seq + 1000))
                    elif how == "garbage":
                        conn.sendall(junk)
                    return True

                if step("challenge", wire.CHALLENGE, {"nonce": "33" * 16, "auth": True}):
                    return
                hello = wire.recv_frame(conn, wire.MAX_META_BYTES)
                mac = auth.proof(SECRET.encode(), "stage1", hello.meta["nonce"], "33" * 16)
                if step("hello_ok", wire.HELLO_OK, {"mac": mac}):
                    return
                if step("run", wire.RUN, run_meta):
                    return
                wire.recv_frame(conn, wire.MAX_META_BYTES)  # RUN_OK
                if step("tensor", wire.TENSOR, None, x):
                    return
                wire.send_frame(conn, wire.TENSOR, 1, x)
                for _ in range(2):
                    wire.recv_frame(conn)
                step("records", wire.RECORDS, None, torch.frombuffer(bytearray(b'{"manifest": 1}'), dtype=torch.uint8))
            except (ParetoPipeError, OSError):
                pass
            finally:
                drain(conn, 2.0)
                srv.close()

    th = threading.Thread(target=play, daemon=True)
    th.start()
    return srv, srv.getsockname()[1], th


def real_stage1_run(worker: Any, spec: messaging.TransportSpec = TCP) -> None:
    """The legitimate stage 1, in this process, runs with the stage-2 ``worker`` over ``spec``."""
    b = builder(MODEL)
    listener = tcp.StageListener(messaging.listen(spec, "127.0.0.1", 0, MAX_PAYLOAD), tcp.identity_of(b),
                                 SECRET.encode())
    try:
        worker.send({"cmd": "connect", "host": "127.0.0.1", "port": listener.port, "secret": SECRET,
                     "connect_timeout": 10, **transport_fields(spec)})
        worker.expect("connected", timeout=30)
        outcome = tcp.run_stage1(listener, b, RunConfig.from_dict(cfg(b)), connect_timeout=10)
        assert outcome.record["status"] == "complete"
        worker.expect("connection_ended", timeout=10)
    finally:
        listener.close()


def stage1_worker(encrypt: str = "none", spec: messaging.TransportSpec = TCP,
                  peer: messaging.TransportSpec = TCP) -> Iterator[tuple[StageProcess, int]]:
    """A stage-1 worker listening on ``spec``'s transport, and the real stage 2 (over ``peer``,
    MQTT's other user) reconnecting to it whenever its connection ends."""
    worker = StageProcess("stage1", [PYTHON, "-m", "paretopipe.controller.worker", "--role", "stage1", "--model", MODEL,
                                     "--threads", "1"])
    worker.ready(120)
    worker.send({"cmd": "listen", "host": "127.0.0.1", "port": 0, "secret": SECRET, "encrypt": encrypt,
                 **transport_fields(spec)})
    port = worker.expect("listening", timeout=30)["port"]
    real = RealStage2(port, encrypt, peer)
    yield worker, port
    real.stop.set()
    worker.stop()


def run_once(worker: StageProcess) -> dict:
    worker.send({"cmd": "run", "config": cfg(builder(MODEL)), "connect_timeout": 30})
    return worker.expect("done", timeout=60)["record"]


def real_run_completes(worker: StageProcess) -> None:
    assert worker.alive(), "the stage-1 worker died"
    record = run_once(worker)
    assert record["status"] == "complete" and record["summary"]["batches_measured"] == 2
    assert [m["role"] for m in record["manifest"]["stages"]] == ["stage1", "stage2"]


def stranger_then_the_real_one(worker: StageProcess, port: int, data, spec: messaging.TransportSpec = TCP) -> None:
    """A stranger (no secret; with MQTT an authenticated user of the broker) mutates the
    handshake; the next run, with the real stage 2, completes."""
    b = builder(MODEL)
    with dial(spec, port) as s:
        wire.recv_frame(s, wire.MAX_META_BYTES)  # the challenge
        hello = {**tcp.identity_of(b), "nonce": "22" * 16, "cuts": None, "mac": "00" * 32}
        what = data.draw(st.sampled_from(["mutated hello", "garbage", "other kind", "two frames"]))
        if what == "mutated hello":
            s.sendall(raw(wire.HELLO, mutate(hello, data)))
        elif what == "garbage":
            s.sendall(garbage(data))
        elif what == "other kind":
            s.sendall(raw(data.draw(st.sampled_from([wire.RUN, wire.RESULT, wire.RECORDS, wire.BYE])), hello))
        else:
            s.sendall(raw(wire.HELLO, hello) + garbage(data))
        drain(s)
    real_run_completes(worker)


def hostile_stage2_then_the_real_one(worker: StageProcess, port: int, data, encrypt: str,
                                     spec: messaging.TransportSpec = TCP) -> None:
    """A hostile stage 2 (over ``spec``) meets the stage-1 ``worker``'s next run; the run after
    it, with the real stage 2, completes."""
    hostile = HostileStage2(port, data, encrypt, spec)
    time.sleep(0.2)  # the listener has it queued: it is the newest connection, so the next run uses it
    worker.send({"cmd": "run", "config": cfg(builder(MODEL)), "connect_timeout": 30})
    try:
        outcome = worker.expect("done", timeout=60)["record"]
        assert outcome["status"] in ("complete", "incomplete")
    except PeerError as exc:  # one error event: the run failed cleanly
        assert "exited" not in str(exc)
    hostile.thread.join(10)
    real_run_completes(worker)


def stage2_worker() -> Iterator[StageProcess]:
    worker = StageProcess("stage2", [PYTHON, "-m", "paretopipe.controller.worker", "--role", "stage2", "--model", MODEL,
                                     "--threads", "1"])
    worker.ready(120)
    yield worker
    worker.stop()


def hostile_stage1_then_the_real_one(stage2: StageProcess, data, spec: messaging.TransportSpec = TCP,
                                     worker: messaging.TransportSpec = TCP, real: messaging.TransportSpec = TCP) -> None:
    """The stage-2 worker (over ``worker``) connects to a hostile stage 1 (over ``spec``), which
    misbehaves at a drawn state; then it serves the real stage 1 (over ``real``)."""
    srv, port, th = hostile_stage1(data, spec)
    stage2.send({"cmd": "connect", "host": "127.0.0.1", "port": port, "secret": SECRET,
                 "connect_timeout": 5, **transport_fields(worker)})
    try:
        stage2.expect("connected", timeout=15)
        stage2.expect("connection_ended", timeout=30)
    except PeerError as exc:  # refused during the handshake: one error event
        assert "exited" not in str(exc)
    th.join(10)
    assert stage2.alive()
    real_stage1_run(stage2, real)
