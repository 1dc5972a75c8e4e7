"""TCP socket backend: stage 1 (the data source, listens) and stage 2 (connects), binary frames.

A **session** is one authenticated connection; it carries any number of runs, so a sweep pays
for connecting and authenticating once per pair of stage workers, not once per configuration:

    stage 1                      stage 2
    CHALLENGE {nonce, auth}  ->
                             <-  HELLO {model, fingerprint, num_classes, wire_version, cuts?, nonce, mac?}
    HELLO_OK {mac?}          ->
    (per run)
    RUN {run_id, config, ...}->
                             <-  RUN_OK
    TENSOR x N               ->
                             <-  RESULT x N (each with stage 2's durations)
    RECORDS (stage 1's part) ->
                             <-  RECORDS (stage 2's manifest and system metrics)
    (end)
    BYE                      ->

An adaptive run (``split_index`` "adaptive", driven by runners/adaptive.py) adds three control
frames: stage 2 answers RUN_OK with its own brief self-profile; SWITCH {cuts} between two batches
moves the split from the next batch on (stage 2 holds every segment); PROBE (a few bytes or a
fixed-size filler) is answered at once by PROBE_ACK, so stage 1 can measure the link between
batches. None of them is accepted in a static run.

Stage 1 stamps each batch on its own monotonic clock when it starts, and again when stage 2's
result has come back and been decoded: that difference is the end-to-end latency, with no clock
of another machine involved. With ``in_flight`` W > 1 up to W batches are outstanding; sender and
receiver threads on each side let compute, transfer and the peer's compute overlap. The up
direction of the network conditions shapes stage 1's frames, the down direction the results.

Everything a peer sends is validated before use. The listener accepts concurrently and gives every
connection one deadline for its whole handshake, so a silent or dripping stranger can neither hold
nor crash it; a refused stranger costs the real peer nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import logging
import queue
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jsonschema
import torch
from torch import nn

from .. import cpushare, records, strict
from ..errors import ParetoPipeError, PeerError, UsageError, WireError
from ..manifest import node_manifest
from ..network.conditions import Direction, NetworkConditions
from ..network.emulated import EmulatedLink, LinkSender
from ..partition.stages import StageBuilder, StageTimer, time_segments
from ..sysmon import SystemMonitor
from . import auth, inputs, wire
from .runconfig import RunConfig
from .schedule import BatchSchedule, status_of

log = logging.getLogger("paretopipe.tcp")

HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING_HANDSHAKES = 32
RESULT_META_FIELDS = ("stage2_decode_s", "stage2_queue_s", "stage2_compute_s", "stage2_encode_s")
IDENTITY_FIELDS = ("model", "fingerprint", "num_classes", "wire_version")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")


@dataclasses.dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    outputs: list[torch.Tensor] | None = None


# -- the messages, checked field by field ----------------------------------------------------------
@dataclasses.dataclass
class Challenge:
    nonce: str
    auth: bool


@dataclasses.dataclass
class Hello:
    model: str
    fingerprint: str
    num_classes: int
    wire_version: int
    nonce: str
    cuts: list[str] | None = None
    mac: str | None = None

    def identity(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in IDENTITY_FIELDS}


@dataclasses.dataclass
class HelloOk:
    mac: str | None = None


@dataclasses.dataclass
class RunStart:
    run_id: str
    config: dict[str, Any]
    link: dict[str, Any]
    return_link: dict[str, Any] | None = None


def _message(cls: type, meta: dict[str, Any], what: str):
    try:
        return strict.from_dict(cls, meta, what)
    except UsageError as exc:
        raise WireError(str(exc))


def safe_run_id(run_id: Any) -> str:
    """A run id is a file name chosen by stage 1: letters, digits, ``._-``, never a path."""
    if not isinstance(run_id, str) or not _SAFE_NAME.match(run_id) or ".." in run_id:
        raise WireError(f"run id {str(run_id)[:80]!r} is not a safe file name ([A-Za-z0-9._-], no path)")
    return run_id


_PART_SCHEMA = {
    "type": "object", "required": ["manifest", "sysmon"],
    "properties": {
        "manifest": {"type": "object", "maxProperties": 64},
        "sysmon": {"type": "object", "maxProperties": 64,
                   "additionalProperties": {"type": ["number", "null", "string"]}},
        "batches": {"type": "array", "maxItems": 1_000_000, "items": {
            "type": "object", "required": ["seq", "warmup"], "maxProperties": 64,
            "properties": {"seq": {"type": "integer", "minimum": 0}, "warmup": {"type": "boolean"}},
            "additionalProperties": {"type": ["number", "boolean", "null", "array"]}}},
    },
}


@functools.lru_cache(maxsize=2)
def _part_validator(batches: bool) -> Any:
    """Built once: ``jsonschema.validate`` checks the schema itself on every call, 9 ms a run."""
    schema = dict(_PART_SCHEMA, required=["manifest", "sysmon"] + (["batches"] if batches else []))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_part(part: Any, who: str, batches: bool) -> dict[str, Any]:
    """A peer's RECORDS part, validated against its schema before anything uses it."""
    error = jsonschema.exceptions.best_match(_part_validator(batches).iter_errors(part))
    if error is not None:
        raise WireError(f"{who}'s RECORDS do not fit the schema: {error.message[:200]}")
    return part


# -- sockets ---------------------------------------------------------------------------------------
def listen(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 0..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc} "
                         f"(is another run using the port?)")
    sock.listen(64)
    return sock


def connect_with_retry(host: str, port: int, connect_timeout: float) -> socket.socket:
    """Connect, retrying until ``connect_timeout``: either side may start first."""
    if not 0 < port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 1..65535")
    deadline = time.monotonic() + connect_timeout
    last: Exception | None = None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=min(5.0, max(0.1, connect_timeout)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise PeerError(f"could not connect to {host}:{port} within {connect_timeout:g}s "
                            f"({last}); is stage 1 (partition1.py) running and reachable?")
        time.sleep(0.2)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def identity_of(builder: StageBuilder) -> dict[str, Any]:
    return {"model": builder.name, "fingerprint": builder.fingerprint, "num_classes": builder.num_classes,
            "wire_version": wire.VERSION}


class Session:
    """One authenticated connection between stage 1 and stage 2; it carries any number of runs."""

    def __init__(self, sock: socket.socket, peer: Hello | None, address: str, max_payload: int) -> None:
        self.sock, self.peer, self.address = sock, peer, address
        self.pool = wire.BufferPool()
        self.reader = wire.FrameReader(sock, max_payload, self.pool)
        self.writer = wire.FrameWriter(sock)
        self.runs = 0
        self.closed = False

    def send(self, kind: int, seq: int = 0, tensor: torch.Tensor | None = None, meta: dict | None = None) -> None:
        self.writer.send(wire.encode(kind, seq, tensor, meta))

    def send_json(self, kind: int, obj: dict[str, Any]) -> None:
        raw = json.dumps(obj, default=records.json_default).encode()
        self.send(kind, 0, torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else None)

    def recv_json(self, kind: int, deadline: float | None = None) -> dict[str, Any]:
        f = wire.expect(self.reader.read(deadline), kind)
        if f.tensor is None or f.tensor.dtype != torch.uint8:
            raise WireError(f"{wire.KIND_NAMES[kind]} frame must carry a uint8 JSON payload")
        try:
            out = wire.loads_bounded(bytes(f.tensor.numpy()))
        finally:
            f.release()
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
        try:
            self.sock.close()
        except OSError:
            pass


# -- stage 1: the listener -------------------------------------------------------------------------
class StageListener:
    """Stage 1's data port. Accepts concurrently: each connection gets one thread and one deadline
    for its whole handshake; a valid, authenticated stage 2 becomes the current session (a newer one
    replaces an older one, so a restarted stage 2 reconnects). Strangers are refused and logged.

    At most MAX_PENDING_HANDSHAKES handshakes are under way at once; a new connection beyond that
    evicts the oldest, not itself. Silent connections (a slowloris) would otherwise hold every slot
    for the handshake timeout and shut out the real peer, whose handshake takes one round trip."""

    def __init__(self, sock: socket.socket, identity: dict[str, Any], secret: bytes | None = None,
                 max_payload: int = wire.DEFAULT_MAX_PAYLOAD, handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.sock, self.identity, self.secret = sock, identity, secret
        self.max_payload, self.handshake_timeout = max_payload, handshake_timeout
        self.expected_cuts: list[str] | None = None
        self.refusals: list[str] = []
        self._sessions: queue.Queue = queue.Queue()
        self._pending: dict[socket.socket, None] = {}  # in arrival order, oldest first
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        host = sock.getsockname()[0]
        if secret is None and not is_loopback(host):
            log.warning("stage 1 listens on %s without a shared secret: any host that reaches this port and "
                        "knows the model can connect; set %s in .env on both hosts", host, auth.SECRET_ENV)
        self._thread = threading.Thread(target=self._accept_loop, name="stage1-accept", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                # EMFILE/ENFILE: out of descriptors; the stalled ones time out, so wait and go on.
                log.warning("stage 1: accept failed (%s); retrying", exc)
                time.sleep(0.1)
                continue
            with self._pending_lock:
                oldest = next(iter(self._pending)) if len(self._pending) >= MAX_PENDING_HANDSHAKES else None
                if oldest is not None:
                    del self._pending[oldest]
                self._pending[conn] = None
            if oldest is not None:
                self._evict(oldest)
            threading.Thread(target=self._handshake, args=(conn, addr[0]), name="stage1-handshake",
                             daemon=True).start()

    def _evict(self, conn: socket.socket) -> None:
        """Wake the oldest handshake's thread with end of stream; it closes and logs the refusal."""
        self._refuse(f"a handshake evicted: more than {MAX_PENDING_HANDSHAKES} at once, the oldest goes")
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _refuse(self, why: str) -> None:
        self.refusals = (self.refusals + [why])[-20:]
        log.warning("stage 1: refused %s; still waiting for the legitimate peer", why)

    def _handshake(self, conn: socket.socket, address: str) -> None:
        deadline = time.monotonic() + self.handshake_timeout
        try:
            conn.settimeout(self.handshake_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            mine = auth.nonce()
            wire.send_frame(conn, wire.CHALLENGE, meta={"nonce": mine, "auth": self.secret is not None})
            hello = _message(Hello, wire.expect(wire.recv_frame(conn, wire.MAX_META_BYTES, deadline=deadline),
                                                wire.HELLO).meta, "HELLO")
            problem = self._check(hello, mine)
            if problem:
                try:
                    wire.send_frame(conn, wire.ERROR, meta={"reason": problem})
                except (ParetoPipeError, OSError):
                    pass
                raise PeerError(problem)
            mac = auth.proof(self.secret, "stage1", hello.nonce, mine) if self.secret else None
            wire.send_frame(conn, wire.HELLO_OK, meta={"mac": mac} if mac else None)
        except (ParetoPipeError, OSError) as exc:
            conn.close()
            self._refuse(f"{address}: {exc}")
            return
        finally:
            with self._pending_lock:
                self._pending.pop(conn, None)
        conn.settimeout(None)
        self._sessions.put(Session(conn, hello, address, self.max_payload))

    def _check(self, hello: Hello, mine: str) -> str | None:
        diffs = [f"{k}: stage 1 has {self.identity[k]!r}, stage 2 has {str(getattr(hello, k))[:100]!r}"
                 for k in IDENTITY_FIELDS if self.identity[k] != getattr(hello, k)]
        cuts = self.expected_cuts
        if cuts is not None and hello.cuts is not None and list(hello.cuts) != list(cuts):
            diffs.append(f"cuts: stage 1 has {cuts!r}, stage 2 has {hello.cuts!r}")
        if diffs:
            return "handshake mismatch: " + "; ".join(diffs)
        if self.secret is None:
            return "stage 2 authenticates but stage 1 has no secret: set the same secret on both" if hello.mac else None
        if hello.mac is None:
            return "authentication required: stage 1 has a shared secret and stage 2 sent no proof"
        if not auth.check(self.secret, hello.mac, "stage2", mine, hello.nonce, hello.identity()):
            return "authentication failed: stage 2 does not know the shared secret"
        return None

    def session(self, timeout: float, current: Session | None = None) -> Session:
        """The newest authenticated session (``current`` if none newer arrived and it is open)."""
        newest = current if current is not None and not current.closed else None
        while True:
            try:
                candidate = self._sessions.get_nowait() if newest is not None else self._sessions.get(timeout=timeout)
            except queue.Empty:
                if newest is not None:
                    return newest
                last = self.refusals[-1] if self.refusals else "no peer connected"
                raise PeerError(f"no valid stage 2 connected within {timeout:g}s ({last})")
            if newest is not None and newest is not candidate:
                newest.close()
            newest = candidate

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        try:
            self.sock.close()
        except OSError:
            pass
        while not self._sessions.empty():
            self._sessions.get_nowait().close()


# -- stage 1: one run ------------------------------------------------------------------------------
class FrameSender(LinkSender):
    """Sends frames in FIFO order from a thread; with an emulated link, each frame is written
    when the link says it has fully arrived, so concurrent frames share the link's rate."""

    def __init__(self, writer: wire.FrameWriter, link: EmulatedLink | None, name: str) -> None:
        super().__init__(link, name)
        self.writer = writer

    def submit(self, enc: wire.Encoded, on_sent: Callable[[float], None] | None = None) -> None:
        super().submit(enc.total_nbytes, lambda: self.writer.send(enc), on_sent)


def result_duration(value: Any, key: str) -> float | None:
    """A duration reported by the peer: a finite non-negative number (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise WireError(f"result meta {key}={str(value)[:40]!r} is not a duration in seconds")
    return float(value)


class _Stage1Run:
    def __init__(self, session: Session, builder: StageBuilder, cfg: RunConfig, link: EmulatedLink | None,
                 keep_outputs: bool) -> None:
        self.session, self.builder, self.cfg, self.link = session, builder, cfg, link
        self.keep_outputs = keep_outputs
        self.stage = builder.stage(cfg.cuts, 0)
        self.timer = StageTimer(builder.device)
        self.codec = wire.Codec(cfg.compression, cfg.compression_level, cfg.wire_dtype)
        self.schedule = BatchSchedule(cfg)
        self.outputs: dict[int, torch.Tensor] = {}
        self.error: BaseException | None = None
        self.sender: FrameSender | None = None

    def _receive(self) -> None:
        try:
            for _ in range(self.schedule.total):
                f = wire.expect(self.session.reader.read(), wire.RESULT)
                # The reader has decoded the result already: now is when it is usable.
                now = time.monotonic()
                durations = {key: result_duration(f.meta.get(key), key) for key in RESULT_META_FIELDS}
                if self.keep_outputs:
                    self.outputs[f.seq] = f.tensor.clone()
                self.schedule.complete(f.seq, now, result_decode_s=f.decode_s, result_wire_bytes=f.wire_nbytes,
                                       **durations)
                f.release()
        except BaseException as exc:
            self.error = exc
            self.schedule.unblock()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.sender is not None and self.sender.error is not None:
            raise self.sender.error

    def run(self) -> None:
        cfg = self.cfg
        cpushare.join_compute_thread()  # data generation and stage 1 run on this thread
        self.sender = FrameSender(self.session.writer, self.link, "stage1-send")
        receiver = threading.Thread(target=self._receive, name="stage1-recv", daemon=True)
        batches = inputs.source_batches(cfg.dataset, cfg.batch_size, self.builder.input_size, self.schedule.total,
                                        cfg.data_dir, cfg.seed, cfg.prefetch_batches)
        receiver.start()
        try:
            for seq in range(self.schedule.total):
                x = next(batches)
                self.schedule.acquire(self._check)
                rec = self.schedule.start(seq)
                out, compute_s = self.timer.run(self.stage, x, self.builder.device)
                enc = wire.frame(wire.TENSOR, seq, wire.encode_payload(out, self.codec))
                rec.update(stage1_compute_s=compute_s, stage1_encode_s=enc.encode_s,
                           payload_bytes=enc.raw_nbytes, wire_bytes=enc.wire_nbytes)
                self.sender.submit(enc, on_sent=lambda s, r=rec: r.__setitem__("stage1_send_s", s))
            self.schedule.wait_finished(self._check, cfg.timeout_s * (1 + self.schedule.total))
        finally:
            if isinstance(batches, inputs.Prefetcher):
                batches.close()
            self.sender.close()
            receiver.join(1.0)


def link_manifest_of(conditions: NetworkConditions | None, emulated: bool, observed: dict | None,
                   link: EmulatedLink | None = None) -> dict[str, Any]:
    if observed is not None:
        return observed
    if conditions is not None and emulated:
        out = {"mode": "emulated", "conditions": conditions.to_dict(),
               "note": "in-process emulation at each sender (serialisation at rate, FIFO, then delay): "
                       "up shapes stage 1's frames, down the results"}
        if link is not None and link.trace is not None:
            out["trace_up"] = link.manifest()["trace"]  # where the replay started: reruns with the seed agree
        return out
    return {"mode": "none", "note": "no shaping by this run; the link is whatever the network is"}


def write_record(record: dict[str, Any], output_dir: str | Path | None) -> Path | None:
    if output_dir is None:
        return None
    return records.atomic_write_json(Path(output_dir) / f"{safe_run_id(record['run_id'])}.json", record)


def run_on_session(session: Session, builder: StageBuilder, cfg: RunConfig, *,
                   conditions: NetworkConditions | None = None, observed_link: dict | None = None,
                   threads: int | None = None, limits: dict[str, Any] | None = None,
                   keep_outputs: bool = False, output_dir: str | Path | None = None) -> RunOutcome:
    """One run as stage 1 over an established session. The record is written into ``output_dir``
    (if given) even when the run fails: ``"status": "incomplete"`` with the batches that completed;
    the error is raised afterwards, and the session is then closed."""
    run_id = records.new_run_id(builder.name, cfg.cuts[0])
    emulated = conditions is not None and cfg.link_mode == "emulated"
    link = EmulatedLink(conditions.up, seed=cfg.seed) if emulated else None
    manifest1 = node_manifest(builder.device, threads, role="stage1", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    link_manifest = link_manifest_of(conditions, emulated, observed_link, link)
    failure: BaseException | None = None
    peer: dict[str, Any] | None = None
    run: _Stage1Run | None = None
    started = time.monotonic()
    session.sock.settimeout(cfg.timeout_s)
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            session.send(wire.RUN, meta={"run_id": run_id, "config": cfg.to_dict(), "link": link_manifest,
                                         "return_link": conditions.down.to_dict() if emulated else None})
            wire.expect(session.reader.read(time.monotonic() + cfg.timeout_s), wire.RUN_OK)
            run = _Stage1Run(session, builder, cfg, link, keep_outputs)
            log.info("stage 1: run %s started with %s", run_id, session.address)
            run.run()
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            failure = exc
    mon.stop()
    status, error = status_of(failure)
    part1 = {"manifest": manifest1, "sysmon": mon.summary(), "batches": run.schedule.records() if run else []}
    if failure is None:
        # Stage 1's part to stage 2 (which writes the record where the anchor did); stage 2's manifest
        # and system metrics back.
        try:
            session.send_json(wire.RECORDS, part1)
            peer = check_part(session.recv_json(wire.RECORDS, time.monotonic() + cfg.timeout_s), "stage 2", False)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 1: records exchange with stage 2 failed: %s", exc)
            failure = exc
    if failure is not None:
        session.close()
    session.runs += 1
    record = assemble_record(run_id, status, error, cfg, part1, peer, link_manifest,
                       {"run_wall_s": time.monotonic() - started, "written_by": "stage1"})
    path = write_record(record, output_dir)
    if failure is not None and status == "incomplete":  # "infeasible" is a measured outcome
        raise failure
    outputs = [run.outputs[s] for s in sorted(run.outputs)] if keep_outputs and run else None
    return RunOutcome(record, path, outputs)


def run_stage1(listener: StageListener, builder: StageBuilder, cfg: RunConfig, *, connect_timeout: float = 60.0,
               **kw: Any) -> RunOutcome:
    """One run as stage 1: wait for an authenticated stage 2 whose cuts fit, run, say goodbye."""
    listener.expected_cuts = list(cfg.cuts)
    session = listener.session(connect_timeout)
    try:
        return run_on_session(session, builder, cfg, **kw)
    finally:
        session.close(bye=True)


def assemble_record(run_id: str, status: str, error: str | None, cfg: RunConfig,
              part1: dict[str, Any] | None, part2: dict[str, Any] | None, link: dict[str, Any],
              timing: dict[str, Any]) -> dict[str, Any]:
    """Merge the two stages' parts. Stage 1's batch records already carry stage 2's durations."""
    batches = (part1 or {}).get("batches") or (part2 or {}).get("batches") or []
    stages = [p["manifest"] for p in (part1, part2) if p]
    sysmon = {f"stage{i}": p["sysmon"] for i, p in ((1, part1), (2, part2)) if p}
    return records.build_run_record(backend="tcp", run_id=run_id, status=status, error=error,
                                    config=cfg.to_dict(),
                                    manifest={"stages": stages, "link": link,
                                              "inputs": inputs.describe(cfg.dataset, cfg.data_dir)},
                                    batches=batches, sysmon=sysmon, timing=timing)


# -- stage 2 ---------------------------------------------------------------------------------------
def open_session(sock: socket.socket, builder: StageBuilder, *, cuts: list[str] | None = None,
                 secret: bytes | None = None, max_payload: int = wire.DEFAULT_MAX_PAYLOAD,
                 timeout: float = HANDSHAKE_TIMEOUT_S) -> Session:
    """Stage 2's half of the handshake over a connected socket (``cuts``: what this side insists on)."""
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    try:
        challenge = _message(Challenge, wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES, deadline=deadline),
                                                    wire.CHALLENGE).meta, "CHALLENGE")
        if secret is not None and not challenge.auth:
            raise PeerError("stage 1 does not authenticate (it has no shared secret); refusing to send it data")
        mine = auth.nonce()
        ident = identity_of(builder)
        hello = {**ident, "nonce": mine, "cuts": cuts}
        if secret is not None:
            hello["mac"] = auth.proof(secret, "stage2", challenge.nonce, mine, ident)
        wire.send_frame(sock, wire.HELLO, meta=hello)
        ok = _message(HelloOk, wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES, deadline=deadline),
                                           wire.HELLO_OK).meta, "HELLO_OK")
    except PeerError as exc:
        sock.close()
        raise PeerError(f"stage 1 refused the handshake: {exc}".replace("peer reported: ", ""))
    except (WireError, OSError) as exc:
        sock.close()
        raise PeerError(f"handshake with stage 1 failed: {exc}")
    if secret is not None and not auth.check(secret, ok.mac, "stage1", mine, challenge.nonce):
        sock.close()
        raise PeerError("authentication failed: stage 1 does not know the shared secret")
    sock.settimeout(None)
    return Session(sock, None, "stage 1", max_payload)


def serve_session(session: Session, builder: StageBuilder, *, output_dir: str | Path | None = None,
                  observed_link: dict | None = None, threads: int | None = None,
                  limits: dict[str, Any] | None = None, timeout_s: float | None = None,
                  on_run: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    """Serve runs on a session until stage 1 says goodbye; returns their outcomes. A failed run
    raises (after writing its incomplete record); the session is closed either way."""
    outcomes = []
    try:
        while True:
            session.sock.settimeout(None)  # between runs stage 1 may take as long as it likes
            f = session.reader.read()
            if f.kind == wire.BYE:
                return outcomes
            outcome = _stage2_run(session, builder, wire.expect(f, wire.RUN).meta, output_dir=output_dir,
                                  observed_link=observed_link, threads=threads, limits=limits, timeout_s=timeout_s)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
    finally:
        session.close()


def _stage2_run(session: Session, builder: StageBuilder, meta: dict[str, Any], *, output_dir, observed_link,
                threads, limits, timeout_s: float | None) -> RunOutcome:
    try:
        start = _message(RunStart, meta, "RUN")
        run_id = safe_run_id(start.run_id)
        # Stage 1 derived the run's deadline from its link; this stage's own --timeout overrides it.
        cfg = RunConfig.from_dict({**start.config, **({"timeout_s": timeout_s} if timeout_s else {})},
                                  "stage 1's run configuration")
        back = Direction.from_dict(start.return_link) if start.return_link else None
        stage = builder.stage(cfg.cuts, 1)
        block_cuts = builder.partitioner.block_cuts() if cfg.adaptive else None
        if block_cuts is not None and cfg.cuts[0] not in block_cuts:
            raise UsageError(f"an adaptive run starts at a block split, not {cfg.cuts[0]!r}")
    except (UsageError, WireError) as exc:
        try:
            session.send(wire.ERROR, meta={"reason": f"stage 2 cannot run this: {exc}"})
        except (ParetoPipeError, OSError):
            pass
        raise WireError(f"stage 1 sent a run stage 2 cannot take: {exc}")
    ok_meta = None
    if cfg.adaptive and not cfg.device_profiles:
        ok_meta = {"profile": self_profile_timings(builder, cfg)}
    session.send(wire.RUN_OK, meta=ok_meta)
    link = EmulatedLink(back, seed=cfg.seed, which="down") if back else None
    timer = StageTimer(builder.device)
    manifest2 = node_manifest(builder.device, threads, role="stage2", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    sender = FrameSender(session.writer, link, "stage2-send")
    work: queue.Queue = queue.Queue()
    seen: dict[int, dict[str, Any]] = {}
    compute_error: list[BaseException] = []

    current = [stage]

    def compute_loop() -> None:
        cpushare.join_compute_thread()
        while True:
            item = work.get()
            if item is None:
                return
            if isinstance(item, nn.Module):  # a SWITCH, in order between two batches
                current[0] = item
                continue
            f, arrived = item
            stage = current[0]
            try:
                began = time.monotonic()
                out, compute_s = timer.run(stage, f.tensor, builder.device)
                payload = wire.encode_payload(out)
                rec = seen[f.seq]
                rec.update(stage2_queue_s=began - arrived, stage2_compute_s=compute_s,
                           stage2_encode_s=payload.encode_s)
                # The activation's buffer goes back to the pool once the result is on the wire: an
                # empty stage 2 (k = K) returns its input itself, sent straight from that buffer.
                sender.submit(wire.frame(wire.RESULT, f.seq, payload, {k: rec[k] for k in RESULT_META_FIELDS}),
                              on_sent=lambda _s, f=f: f.release())
            except BaseException as exc:
                compute_error.append(exc)
                return

    worker = threading.Thread(target=compute_loop, name="stage2-compute", daemon=True)
    worker.start()
    failure: BaseException | None = None
    part1 = None
    started = time.monotonic()
    session.sock.settimeout(cfg.timeout_s)
    total = cfg.warmup + cfg.num_batches
    switches = 0
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            while True:
                kinds = (wire.TENSOR, wire.RECORDS) + ((wire.SWITCH, wire.PROBE) if cfg.adaptive else ())
                f = wire.expect(session.reader.read(), *kinds)
                if compute_error:
                    raise compute_error[0]
                if sender.error is not None:
                    raise sender.error
                if f.kind == wire.RECORDS:
                    part1 = check_part(json_of(f), "stage 1", True)
                    break
                if f.kind == wire.SWITCH:
                    work.put(_switch_stage(builder, f.meta, block_cuts))
                    switches += 1
                    continue
                if f.kind == wire.PROBE:
                    f.release()
                    sender.submit(wire.frame(wire.PROBE_ACK, f.seq))
                    continue
                if f.seq in seen or not 0 <= f.seq < total:
                    raise WireError(f"batch {f.seq} sent twice or out of range 0..{total - 1}")
                if f.tensor is None:
                    raise WireError(f"batch {f.seq} carries no tensor")
                seen[f.seq] = {"seq": f.seq, "warmup": f.seq < cfg.warmup, "stage2_decode_s": f.decode_s,
                               "payload_bytes": f.raw_nbytes, "wire_bytes": f.wire_nbytes}
                work.put((f, time.monotonic()))
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            failure = exc
        finally:
            work.put(None)
            worker.join(timeout=cfg.timeout_s)
    mon.stop()
    status, error = status_of(failure)
    if cfg.adaptive:
        manifest2 = {**manifest2, "adaptive": {"switches_applied": switches,
                                               "self_profile": (ok_meta or {}).get("profile")}}
    part2 = {"manifest": manifest2, "sysmon": mon.summary(), "batches": [seen[s] for s in sorted(seen)]}
    if part1 is not None:
        try:
            session.send_json(wire.RECORDS, {"manifest": manifest2, "sysmon": part2["sysmon"]})
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 2: could not send its records to stage 1: %s", exc)
    sender.close()
    record = assemble_record(run_id, status, error, cfg, part1, part2, observed_link or start.link,
                       {"run_wall_s": time.monotonic() - started, "written_by": "stage2"})
    path = write_record(record, output_dir)
    if failure is not None:
        raise failure
    return RunOutcome(record, path)


def self_profile_timings(builder: StageBuilder, cfg: RunConfig) -> dict[str, Any]:
    """This node's block segment times at the run's batch size, measured once per process and
    batch size (a sweep's later adaptive runs reuse it; each run records it)."""
    key = ("self_profile", cfg.batch_size)
    cache = builder.timings
    if key not in cache:
        cpushare.join_compute_thread()  # under the same CPU share as the stage's compute
        x = next(inputs.batches("synthetic", cfg.batch_size, builder.input_size, 1, None, cfg.seed))
        cache[key] = time_segments(builder, builder.partitioner.block_cuts()[1:-1], x)
    return cache[key]


def _switch_stage(builder: StageBuilder, meta: dict[str, Any], block_cuts: list[str] | None) -> nn.Module:
    """Stage 2's part for the split a SWITCH names: one of the model's block cuts, nothing else."""
    cuts = meta.get("cuts")
    if not (isinstance(cuts, list) and len(cuts) == 1 and block_cuts and cuts[0] in block_cuts):
        raise WireError(f"SWITCH names {str(cuts)[:80]!r}; an adaptive run switches between block cuts only")
    return builder.stage(cuts, 1)


def json_of(f: wire.Frame) -> Any:
    if f.tensor is None or f.tensor.dtype != torch.uint8:
        raise WireError("RECORDS frame must carry a uint8 JSON payload")
    try:
        return wire.loads_bounded(bytes(f.tensor.numpy()))
    finally:
        f.release()
