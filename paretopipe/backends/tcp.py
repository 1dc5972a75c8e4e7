"""TCP socket backend: stage 1 (data source, listens) and stage 2 (connects), binary frames.

Stage 1 stamps each batch on its own monotonic clock when it starts, and again when stage 2's
result has come back and been decoded: that difference is the end-to-end latency, with no clock
of another machine involved. Stage 2 reports its own durations inside each result frame.
With ``in_flight`` W > 1, stage 1 keeps up to W batches outstanding; a sender thread and a
receiver thread on each side let compute, transfer and the peer's compute overlap.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import cpushare, data, records, wire
from ..errors import ParetoPipeError, PeerError, UsageError, WireError
from ..link import EmulatedLink, LinkSender, Profile
from ..sysmon import SystemMonitor
from .common import RunConfig, StageBuilder, StageTimer

log = logging.getLogger("paretopipe.tcp")

HANDSHAKE_TIMEOUT_S = 5.0
# Fields both sides must agree on before any tensor moves.
HANDSHAKE_FIELDS = ("model", "cuts", "fingerprint", "batch_size", "num_classes", "wire_version")


@dataclasses.dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    outputs: list[torch.Tensor] | None = None


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
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror} (is another run using the port?)")
    sock.listen(4)
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
    diffs = [f"{k}: stage 1 has {mine.get(k)!r}, stage 2 has {theirs.get(k)!r}"
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
        self.batches: dict[int, dict[str, Any]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.window = threading.Semaphore(cfg.in_flight)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.total = cfg.warmup + cfg.num_batches
        self.t0 = time.monotonic()

    def _receive(self) -> None:
        received = 0
        try:
            while received < self.total:
                f = wire.expect(wire.recv_frame(self.conn, self.max_payload), wire.RESULT)
                now = time.monotonic()
                rec = self.batches.get(f.seq)
                if rec is None or "end_s" in rec:
                    raise WireError(f"result for unknown or repeated batch {f.seq}")
                # recv_frame has decoded the result already: ``now`` is when it is usable.
                rec["end_s"] = now - self.t0
                rec["latency_s"] = now - rec["_start"]
                rec["result_decode_s"] = f.decode_s
                rec["result_wire_bytes"] = f.wire_nbytes
                for key in ("stage2_decode_s", "stage2_queue_s", "stage2_compute_s", "stage2_encode_s"):
                    rec[key] = f.meta.get(key)
                if self.keep_outputs:
                    self.outputs[f.seq] = f.tensor
                received += 1
                self.window.release()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()
            self.window.release()

    def _acquire_slot(self) -> None:
        deadline = time.monotonic() + self.cfg.timeout_s
        while not self.window.acquire(timeout=0.05):
            self._check()
            if time.monotonic() > deadline:
                raise PeerError(f"no result from stage 2 for {self.cfg.timeout_s:g}s (timeout)")
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.sender.error is not None:
            raise self.sender.error

    def run(self) -> None:
        cfg = self.cfg
        cpushare.join_compute_thread()  # data generation and stage 1 run on this thread
        self.sender = FrameSender(self.conn, self.link, "stage1-send")
        self.conn.settimeout(cfg.timeout_s)
        receiver = threading.Thread(target=self._receive, name="stage1-recv", daemon=True)
        inputs = data.batches(cfg.dataset, cfg.batch_size, self.builder.input_size, self.total,
                              cfg.data_dir, cfg.seed)
        receiver.start()
        try:
            for seq in range(self.total):
                x = next(inputs)
                self._acquire_slot()
                start = time.monotonic()
                rec = {"seq": seq, "warmup": seq < cfg.warmup, "_start": start, "start_s": start - self.t0}
                self.batches[seq] = rec
                out, compute_s = self.timer.run(self.stage, x, self.builder.device)
                payload = wire.encode_payload(out, self.codec)
                enc = wire.frame(wire.TENSOR, seq, payload)
                rec.update(stage1_compute_s=compute_s, stage1_encode_s=enc.encode_s,
                           payload_bytes=enc.raw_nbytes, wire_bytes=enc.wire_nbytes)
                self.sender.submit(enc, on_sent=lambda s, r=rec: r.__setitem__("stage1_send_s", s))
            while not self.done.wait(0.05):
                self._check()
                if time.monotonic() - self.t0 > cfg.timeout_s * (1 + self.total):
                    raise PeerError("stage 2 never finished the run (timeout)")
            self._check()
        finally:
            self.sender.close()

    def batch_records(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in self.batches[s].items() if not k.startswith("_")}
                for s in sorted(self.batches)]


def _json_payload(f: wire.Frame) -> dict[str, Any]:
    import json

    if f.tensor is None or f.tensor.dtype != torch.uint8:
        raise WireError("RECORDS frame must carry a uint8 JSON payload")
    try:
        out = json.loads(bytes(f.tensor.numpy()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"RECORDS payload is not UTF-8 JSON: {exc}")
    if not isinstance(out, dict):
        raise WireError("RECORDS payload must be a JSON object")
    return out


def _send_json(sock: socket.socket, kind: int, obj: dict[str, Any]) -> None:
    import json

    raw = json.dumps(obj, default=records._json_default).encode()
    wire.send_frame(sock, kind, 0, torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else None)


def _link_manifest(link: EmulatedLink | None, observed: dict | None) -> dict[str, Any]:
    if observed is not None:
        return observed
    if link is not None:
        return link.manifest()
    return {"mode": "none", "note": "no shaping by this run; the link is whatever the network is"}


def _write(record: dict[str, Any], output_dir: str | Path | None) -> Path | None:
    if output_dir is None:
        return None
    return records.atomic_write_json(Path(output_dir) / f"{record['run_id']}.json", record)


def run_stage1(listener: socket.socket, builder: StageBuilder, cfg: RunConfig, *,
               profile: Profile | None = None, connect_timeout: float = 60.0,
               output_dir: str | Path | None = None, keep_outputs: bool = False,
               observed_link: dict | None = None, threads: int | None = None,
               max_payload: int = wire.DEFAULT_MAX_PAYLOAD) -> RunOutcome:
    """Serve one run as stage 1 (data source). Writes the run JSON into ``output_dir`` if given.

    On a dead peer, timeout or Ctrl-C the JSON is still written, with ``"status": "incomplete"``
    and the batches that completed, and the error is raised afterwards.
    """
    expected = _hello_fields(builder, cfg)
    conn, hello = accept_peer(listener, expected, connect_timeout, max_payload)
    run_id = records.new_run_id(builder.name, cfg.cuts[0])
    link = EmulatedLink(profile, seed=cfg.seed) if profile is not None and cfg.link_mode == "emulated" else None
    manifest1 = records.node_manifest(builder.device, threads, role="stage1",
                                      weights_fingerprint=builder.fingerprint,
                                      limits=cfg.extra.get("stage_limits"))
    link_manifest = _link_manifest(link, observed_link)
    wire.send_frame(conn, wire.HELLO_OK, meta={
        "run_id": run_id, "config": cfg.to_dict(), "link": link_manifest,
        "return_link": profile.to_dict() if link is not None else None})
    run = _Stage1Run(conn, builder, cfg, link, keep_outputs, max_payload)
    log.info("stage 1: peer %s passed the handshake; run %s started", hello.get("model"), run_id)
    status, error, failure = "complete", None, None
    started = time.monotonic()
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            run.run()
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            status, failure = "incomplete", exc
            error = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
    mon.stop()
    part1 = {"manifest": manifest1, "sysmon": mon.summary(), "batches": run.batch_records()}
    peer = None
    if status == "complete":
        # Records exchange: ours to stage 2 (which writes the JSON where the anchor did), its
        # manifest and system metrics back to us, then goodbye.
        try:
            conn.settimeout(cfg.timeout_s)
            _send_json(conn, wire.RECORDS, part1)
            peer = _json_payload(wire.expect(wire.recv_frame(conn, max_payload), wire.RECORDS))
            wire.send_frame(conn, wire.BYE)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 1: records exchange with stage 2 failed: %s", exc)
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
    config = cfg.to_dict()
    config.pop("extra", None)
    config.update(cfg.extra)
    return records.build_run_record(backend="tcp", run_id=run_id, status=status, error=error,
                                    config=config, manifest={"stages": stages, "link": link},
                                    batches=batches, sysmon=sysmon, timing=timing)


# -- stage 2 -------------------------------------------------------------------------------------
def run_stage2(sock: socket.socket, builder: StageBuilder, cfg: RunConfig, *,
               output_dir: str | Path | None = ".", observed_link: dict | None = None,
               threads: int | None = None, max_payload: int = wire.DEFAULT_MAX_PAYLOAD) -> RunOutcome:
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
    run_id = ok["run_id"]
    own_limits = cfg.extra.get("stage_limits")
    cfg = RunConfig.from_dict({**ok["config"], "timeout_s": cfg.timeout_s})
    back = ok.get("return_link")
    link = EmulatedLink(Profile.from_dict(back), seed=cfg.seed + 1) if back else None
    stage = builder.stage(cfg.cuts, 1)
    timer = StageTimer(builder.device)
    manifest2 = records.node_manifest(builder.device, threads, role="stage2",
                                      weights_fingerprint=builder.fingerprint, limits=own_limits)
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
                meta = {k: rec[k] for k in ("stage2_decode_s", "stage2_queue_s", "stage2_compute_s",
                                            "stage2_encode_s")}
                sender.submit(wire.frame(wire.RESULT, f.seq, payload, meta))
            except BaseException as exc:
                compute_error.append(exc)
                return

    worker = threading.Thread(target=compute_loop, name="stage2-compute", daemon=True)
    worker.start()
    status, error, failure, part1 = "complete", None, None, None
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
                    part1 = _json_payload(f)
                    break
                if f.seq in seen:
                    raise WireError(f"batch {f.seq} sent twice")
                seen[f.seq] = {"seq": f.seq, "warmup": f.seq < cfg.warmup, "stage2_decode_s": f.decode_s,
                               "payload_bytes": f.raw_nbytes, "wire_bytes": f.wire_nbytes}
                work.put((f, time.monotonic()))
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            status, failure = "incomplete", exc
            error = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
        finally:
            work.put(None)
            worker.join(timeout=cfg.timeout_s)
    mon.stop()
    part2 = {"manifest": manifest2, "sysmon": mon.summary(),
             "batches": [seen[s] for s in sorted(seen)]}
    if part1 is not None:
        try:
            _send_json(sock, wire.RECORDS, {"manifest": manifest2, "sysmon": part2["sysmon"]})
            wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES), wire.BYE)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 2: stage 1 left before saying goodbye: %s", exc)
    sender.close()
    sock.close()
    if part1 is not None and "manifest" not in part1:
        part1 = None
    record = _assemble(run_id, status, error, cfg, part1, part2, observed_link or ok["link"],
                       {"run_wall_s": time.monotonic() - started, "written_by": "stage2"})
    path = _write(record, output_dir)
    if failure is not None:
        raise failure
    return RunOutcome(record, path)
