"""TCP socket backend: stage 1 (data source, listens) and stage 2 (connects), binary frames.

Stage 1 stamps each batch on its own monotonic clock when it starts, and again when stage 2's
result has come back and been decoded: that difference is the end-to-end latency, with no clock
of another machine involved. Stage 2 reports its own durations inside each result frame.
With ``in_flight`` W > 1, stage 1 keeps up to W batches outstanding; a sender thread and a
receiver thread on each side let compute, transfer and the peer's compute overlap. The up
direction of the network conditions shapes stage 1's frames, the down direction the results.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import cpushare, records
from ..errors import ParetoPipeError, PeerError, UsageError, WireError
from ..manifest import node_manifest
from ..network.conditions import Direction, NetworkConditions
from ..network.emulated import EmulatedLink, LinkSender
from ..partition.stages import StageBuilder, StageTimer
from ..sysmon import SystemMonitor
from . import inputs, wire
from .runconfig import RunConfig
from .schedule import BatchSchedule, status_of

log = logging.getLogger("paretopipe.tcp")

HANDSHAKE_TIMEOUT_S = 5.0
# Fields both sides must agree on before any tensor moves.
HANDSHAKE_FIELDS = ("model", "cuts", "fingerprint", "batch_size", "num_classes", "wire_version")
RESULT_META_FIELDS = ("stage2_decode_s", "stage2_queue_s", "stage2_compute_s", "stage2_encode_s")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")


@dataclasses.dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    outputs: list[torch.Tensor] | None = None


def safe_run_id(run_id: Any) -> str:
    """A run id is a file name chosen by stage 1: letters, digits, ``._-``, never a path."""
    if not isinstance(run_id, str) or not _SAFE_NAME.match(run_id) or ".." in run_id:
        raise WireError(f"run id {str(run_id)[:80]!r} is not a safe file name ([A-Za-z0-9._-], no path)")
    return run_id


class FrameSender(LinkSender):
    """Sends frames in FIFO order from a thread; with an emulated link, each frame is written
    when the link says it has fully arrived, so concurrent frames share the link's rate."""

    def __init__(self, sock: socket.socket, link: EmulatedLink | None, name: str) -> None:
        super().__init__(link, name)
        self.sock = sock

    def submit(self, enc: wire.Encoded, on_sent: Callable[[float], None] | None = None) -> None:
        super().submit(enc.total_nbytes, lambda: wire.send_encoded(self.sock, enc), on_sent)


# -- connection setup ----------------------------------------------------------------------------
def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc} "
                         f"(is another run using the port?)")
    sock.listen(16)
    return sock


def connect_with_retry(host: str, port: int, connect_timeout: float) -> socket.socket:
    """Connect, retrying until ``connect_timeout``: either side may start first."""
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


def _hello_fields(builder: StageBuilder, cfg: RunConfig) -> dict[str, Any]:
    return {"model": builder.name, "cuts": list(cfg.cuts), "fingerprint": builder.fingerprint,
            "batch_size": cfg.batch_size, "num_classes": cfg.num_classes, "wire_version": wire.VERSION}


def _mismatch(mine: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    diffs = [f"{k}: stage 1 has {mine.get(k)!r}, stage 2 has {str(theirs.get(k))[:200]!r}"
             for k in HANDSHAKE_FIELDS if mine.get(k) != theirs.get(k)]
    return "; ".join(diffs) or None


def accept_peer(listener: socket.socket, expected: dict[str, Any], connect_timeout: float,
                max_payload: int) -> tuple[socket.socket, dict[str, Any]]:
    """Accept until a peer completes a matching handshake; strangers are refused and logged,
    and the listener keeps waiting for the legitimate peer until ``connect_timeout``."""
    deadline = time.monotonic() + connect_timeout
    last_refusal = "no peer connected"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"no valid stage 2 connected within {connect_timeout:g}s ({last_refusal})")
        listener.settimeout(remaining)
        try:
            conn, addr = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(min(HANDSHAKE_TIMEOUT_S, max(0.1, remaining)))
        try:
            hello = wire.expect(wire.recv_frame(conn, max_payload=wire.MAX_META_BYTES), wire.HELLO).meta
            problem = _mismatch(expected, hello)
            if problem is None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return conn, hello
            last_refusal = f"refused {addr[0]}: {problem}"
            wire.send_frame(conn, wire.ERROR, meta={"reason": f"handshake mismatch: {problem}"})
        except (WireError, PeerError, OSError) as exc:
            last_refusal = f"refused {addr[0]}: {exc}"
        log.warning("stage 1: %s; still waiting for the legitimate peer", last_refusal)
        conn.close()


# -- stage 1 -------------------------------------------------------------------------------------
class _Stage1Run:
    def __init__(self, conn: socket.socket, builder: StageBuilder, cfg: RunConfig,
                 link: EmulatedLink | None, keep_outputs: bool, max_payload: int) -> None:
        self.conn, self.builder, self.cfg, self.link = conn, builder, cfg, link
        self.keep_outputs, self.max_payload = keep_outputs, max_payload
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
                f = wire.expect(wire.recv_frame(self.conn, self.max_payload), wire.RESULT)
                # recv_frame has decoded the result already: now is when it is usable.
                now = time.monotonic()
                durations = {key: _duration(f.meta.get(key), key) for key in RESULT_META_FIELDS}
                self.schedule.complete(f.seq, now, result_decode_s=f.decode_s, result_wire_bytes=f.wire_nbytes,
                                       **durations)
                if self.keep_outputs:
                    self.outputs[f.seq] = f.tensor
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
        self.sender = FrameSender(self.conn, self.link, "stage1-send")
        self.conn.settimeout(cfg.timeout_s)
        receiver = threading.Thread(target=self._receive, name="stage1-recv", daemon=True)
        batches = inputs.batches(cfg.dataset, cfg.batch_size, self.builder.input_size, self.schedule.total,
                                 cfg.data_dir, cfg.seed)
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
            self.sender.close()


def _duration(value: Any, key: str) -> float | None:
    """A duration reported by the peer: a finite non-negative number (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise WireError(f"result meta {key}={str(value)[:40]!r} is not a duration in seconds")
    return float(value)


def json_payload(f: wire.Frame) -> dict[str, Any]:
    if f.tensor is None or f.tensor.dtype != torch.uint8:
        raise WireError("RECORDS frame must carry a uint8 JSON payload")
    try:
        out = wire.loads_bounded(bytes(f.tensor.numpy()))
    except WireError as exc:
        raise WireError(f"RECORDS payload: {exc}")
    if not isinstance(out, dict):
        raise WireError("RECORDS payload must be a JSON object")
    return out


def send_json(sock: socket.socket, kind: int, obj: dict[str, Any]) -> None:
    raw = json.dumps(obj, default=records.json_default).encode()
    wire.send_frame(sock, kind, 0, torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else None)


def _link_manifest(conditions: NetworkConditions | None, emulated: bool, observed: dict | None) -> dict[str, Any]:
    if observed is not None:
        return observed
    if conditions is not None and emulated:
        return {"mode": "emulated", "conditions": conditions.to_dict(),
                "note": "in-process emulation at each sender (serialisation at rate, FIFO, then delay): "
                        "up shapes stage 1's frames, down the results"}
    return {"mode": "none", "note": "no shaping by this run; the link is whatever the network is"}


def _write(record: dict[str, Any], output_dir: str | Path | None) -> Path | None:
    if output_dir is None:
        return None
    return records.atomic_write_json(Path(output_dir) / f"{safe_run_id(record['run_id'])}.json", record)


def run_stage1(listener: socket.socket, builder: StageBuilder, cfg: RunConfig, *,
               conditions: NetworkConditions | None = None, connect_timeout: float = 60.0,
               output_dir: str | Path | None = None, keep_outputs: bool = False,
               observed_link: dict | None = None, threads: int | None = None,
               limits: dict[str, Any] | None = None,
               max_payload: int = wire.DEFAULT_MAX_PAYLOAD) -> RunOutcome:
    """Serve one run as stage 1 (data source). Writes the run JSON into ``output_dir`` if given.

    On a dead peer, timeout or Ctrl-C the JSON is still written, with ``"status": "incomplete"``
    and the batches that completed, and the error is raised afterwards.
    """
    expected = _hello_fields(builder, cfg)
    conn, hello = accept_peer(listener, expected, connect_timeout, max_payload)
    run_id = records.new_run_id(builder.name, cfg.cuts[0])
    emulated = conditions is not None and cfg.link_mode == "emulated"
    link = EmulatedLink(conditions.up, seed=cfg.seed) if emulated else None
    manifest1 = node_manifest(builder.device, threads, role="stage1", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    link_manifest = _link_manifest(conditions, emulated, observed_link)
    wire.send_frame(conn, wire.HELLO_OK, meta={
        "run_id": run_id, "config": cfg.to_dict(), "link": link_manifest,
        "return_link": conditions.down.to_dict() if emulated else None})
    run = _Stage1Run(conn, builder, cfg, link, keep_outputs, max_payload)
    log.info("stage 1: peer %s passed the handshake; run %s started", hello.get("model"), run_id)
    failure: BaseException | None = None
    started = time.monotonic()
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            run.run()
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            failure = exc
    mon.stop()
    status, error = status_of(failure)
    part1 = {"manifest": manifest1, "sysmon": mon.summary(), "batches": run.schedule.records()}
    peer = None
    if failure is None:
        # Records exchange: ours to stage 2 (which writes the JSON where the anchor did), its
        # manifest and system metrics back to us, then goodbye.
        try:
            conn.settimeout(cfg.timeout_s)
            send_json(conn, wire.RECORDS, part1)
            peer = json_payload(wire.expect(wire.recv_frame(conn, max_payload), wire.RECORDS))
            if not isinstance(peer.get("manifest"), dict) or not isinstance(peer.get("sysmon"), dict):
                raise WireError("stage 2's RECORDS lack a manifest or sysmon object")
            wire.send_frame(conn, wire.BYE)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 1: records exchange with stage 2 failed: %s", exc)
            peer = None
    conn.close()
    record = _assemble(run_id, status, error, cfg, part1, peer, link_manifest,
                       {"run_wall_s": time.monotonic() - started, "written_by": "stage1"})
    path = _write(record, output_dir)
    if failure is not None:
        raise failure
    outputs = [run.outputs[s] for s in sorted(run.outputs)] if keep_outputs else None
    return RunOutcome(record, path, outputs)


def _assemble(run_id: str, status: str, error: str | None, cfg: RunConfig,
              part1: dict[str, Any] | None, part2: dict[str, Any] | None, link: dict[str, Any],
              timing: dict[str, Any]) -> dict[str, Any]:
    """Merge the two stages' parts. Stage 1's batch records already carry stage 2's durations."""
    batches = (part1 or {}).get("batches") or (part2 or {}).get("batches") or []
    stages = [p["manifest"] for p in (part1, part2) if p]
    sysmon = {f"stage{i}": p["sysmon"] for i, p in ((1, part1), (2, part2)) if p}
    return records.build_run_record(backend="tcp", run_id=run_id, status=status, error=error,
                                    config=cfg.to_dict(), manifest={"stages": stages, "link": link},
                                    batches=batches, sysmon=sysmon, timing=timing)


# -- stage 2 -------------------------------------------------------------------------------------
def run_stage2(sock: socket.socket, builder: StageBuilder, cfg: RunConfig, *,
               output_dir: str | Path | None = ".", observed_link: dict | None = None,
               threads: int | None = None, limits: dict[str, Any] | None = None,
               max_payload: int = wire.DEFAULT_MAX_PAYLOAD) -> RunOutcome:
    """Run stage 2 over a connected socket: handshake, compute every batch, return every result.

    The run's settings (batches, warm-up, window, codecs) come from stage 1, the data source;
    ``cfg`` supplies what must match (model, cuts, batch size) and the timeout.
    """
    sock.settimeout(HANDSHAKE_TIMEOUT_S + cfg.timeout_s)
    wire.send_frame(sock, wire.HELLO, meta=_hello_fields(builder, cfg))
    try:
        ok = wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES), wire.HELLO_OK).meta
    except PeerError as exc:
        raise PeerError(f"stage 1 refused the handshake: {exc}".replace("peer reported: ", ""))
    try:
        run_id = safe_run_id(ok.get("run_id"))
        cfg = RunConfig.from_dict({**ok.get("config", {}), "timeout_s": cfg.timeout_s}, "stage 1's run configuration")
        back = Direction.from_dict(ok["return_link"]) if ok.get("return_link") else None
        link_manifest = ok.get("link") if isinstance(ok.get("link"), dict) else {"mode": "unknown"}
    except UsageError as exc:
        raise WireError(f"stage 1 sent a malformed HELLO_OK: {exc}")
    link = EmulatedLink(back, seed=cfg.seed + 1) if back else None
    stage = builder.stage(cfg.cuts, 1)
    timer = StageTimer(builder.device)
    manifest2 = node_manifest(builder.device, threads, role="stage2", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    sender = FrameSender(sock, link, "stage2-send")
    work: queue.Queue = queue.Queue()
    seen: dict[int, dict[str, Any]] = {}
    compute_error: list[BaseException] = []

    def compute_loop() -> None:
        cpushare.join_compute_thread()
        while True:
            item = work.get()
            if item is None:
                return
            f, arrived = item
            try:
                began = time.monotonic()
                out, compute_s = timer.run(stage, f.tensor, builder.device)
                payload = wire.encode_payload(out)
                rec = seen[f.seq]
                rec.update(stage2_queue_s=began - arrived, stage2_compute_s=compute_s,
                           stage2_encode_s=payload.encode_s)
                sender.submit(wire.frame(wire.RESULT, f.seq, payload, {k: rec[k] for k in RESULT_META_FIELDS}))
            except BaseException as exc:
                compute_error.append(exc)
                return

    worker = threading.Thread(target=compute_loop, name="stage2-compute", daemon=True)
    worker.start()
    failure: BaseException | None = None
    part1 = None
    started = time.monotonic()
    sock.settimeout(cfg.timeout_s)
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            while True:
                f = wire.expect(wire.recv_frame(sock, max_payload), wire.TENSOR, wire.RECORDS)
                if compute_error:
                    raise compute_error[0]
                if sender.error is not None:
                    raise sender.error
                if f.kind == wire.RECORDS:
                    part1 = json_payload(f)
                    break
                if f.seq in seen:
                    raise WireError(f"batch {f.seq} sent twice")
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
    part2 = {"manifest": manifest2, "sysmon": mon.summary(), "batches": [seen[s] for s in sorted(seen)]}
    if part1 is not None:
        try:
            send_json(sock, wire.RECORDS, {"manifest": manifest2, "sysmon": part2["sysmon"]})
            wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES), wire.BYE)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 2: stage 1 left before saying goodbye: %s", exc)
    sender.close()
    sock.close()
    if part1 is not None and not (isinstance(part1.get("manifest"), dict) and isinstance(part1.get("batches"), list)
                                  and isinstance(part1.get("sysmon"), dict)):
        part1 = None
    record = _assemble(run_id, status, error, cfg, part1, part2, observed_link or link_manifest,
                       {"run_wall_s": time.monotonic() - started, "written_by": "stage2"})
    path = _write(record, output_dir)
    if failure is not None:
        raise failure
    return RunOutcome(record, path)
