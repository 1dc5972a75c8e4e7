"""The later stage of a TCP run, the sink: it serves stage 1's runs on a connection until BYE,
computes its part of each batch on one thread and returns results with its own durations. An
adaptive run adds SWITCH (the split moves between two batches) and PROBE (answered at once)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from torch import nn

from ... import cpushare
from ...errors import ParetoPipeError, UsageError, WireError
from ...manifest import node_manifest
from ...network.conditions import Direction
from ...network.emulated import EmulatedLink
from ...partition.stages import StageBuilder, StageTimer, time_segments
from ...sysmon import SystemMonitor
from .. import inputs, wire
from ..resources import stage_meter
from ..runconfig import RunConfig
from ..schedule import status_of
from .connection import Connection, FrameSender
from .messages import RESULT_META_FIELDS, RunStart, check_part, json_payload, message, safe_run_id
from .outcome import RunOutcome, assemble_record, cipher_usage, merge_peer_seals, write_record

log = logging.getLogger("paretopipe.tcp")


def serve_connection(connection: Connection, builder: StageBuilder, *, output_dir: str | Path | None = None,
                     observed_link: dict | None = None, threads: int | None = None,
                     limits: dict[str, Any] | None = None, timeout_s: float | None = None,
                     on_run: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    """Serve runs on a connection until stage 1 says goodbye; returns their outcomes. A failed run
    raises (after writing its incomplete record); the connection is closed either way."""
    outcomes = []
    try:
        while True:
            connection.sock.settimeout(None)  # between runs stage 1 may take as long as it likes
            sealed_before = connection.channel.usage() if connection.channel else None  # a run's share from RUN on
            f = connection.reader.read()
            if f.kind == wire.BYE:
                return outcomes
            outcome = _stage2_run(connection, builder, wire.expect(f, wire.RUN).meta, output_dir=output_dir,
                                  observed_link=observed_link, threads=threads, limits=limits, timeout_s=timeout_s,
                                  sealed_before=sealed_before)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
    finally:
        connection.close()


def _stage2_run(connection: Connection, builder: StageBuilder, meta: dict[str, Any], *, output_dir, observed_link,
                threads, limits, timeout_s: float | None, sealed_before: dict[str, Any] | None = None) -> RunOutcome:
    run = _SinkRun(connection, builder, meta, timeout_s, threads=threads, limits=limits, sealed_before=sealed_before)
    started = time.monotonic()
    part1, failure = run.serve()
    status, error = status_of(failure)
    part2 = run.part(part1 is not None)
    if part1 is not None:
        merge_peer_seals(part1["batches"], part2["batches"])
    record = assemble_record(run.run_id, status, error, run.cfg, part1, part2, observed_link or run.start.link,
                             {"run_wall_s": time.monotonic() - started, "written_by": "stage2"})
    path = write_record(record, output_dir)
    if failure is not None:
        raise failure
    return RunOutcome(record, path)


class _SinkRun:
    """One run as stage 2: this thread reads stage 1's frames while a compute thread works through
    the batches in arrival order (a SWITCH takes its turn between two of them) and sends results."""

    def __init__(self, connection: Connection, builder: StageBuilder, meta: dict[str, Any], timeout_s: float | None,
                 *, threads: int | None, limits: dict[str, Any] | None,
                 sealed_before: dict[str, Any] | None = None) -> None:
        self.connection, self.builder = connection, builder
        back = self._accept(meta, timeout_s)
        cfg = self.cfg
        self.ok_meta = {"profile": self_profile_timings(builder, cfg)} \
            if cfg.adaptive and not cfg.device_profiles else None
        # Before RUN_OK: a first run measures idle power while stage 1 waits, idle too.
        self.meter = stage_meter(builder, cfg, 1)
        connection.send(wire.RUN_OK, meta=self.ok_meta)
        self.timer = StageTimer(builder.device)
        self.manifest = node_manifest(builder.device, threads, role="stage2", weights_fingerprint=builder.fingerprint,
                                      limits=limits)
        self.sender = FrameSender(connection.writer, EmulatedLink(back, seed=cfg.seed, which="down") if back else None,
                                  "stage2-send")
        self.work: queue.Queue = queue.Queue()
        self.seen: dict[int, dict[str, Any]] = {}
        self.compute_error: list[BaseException] = []
        self.switches = 0
        self.sysmon: dict[str, Any] = {}
        self.sealed = connection.channel is not None
        self.sealed_before = sealed_before  # the connection's AEAD counters when RUN came

    def _accept(self, meta: dict[str, Any], timeout_s: float | None) -> Direction | None:
        """Stage 1's RUN, checked (returns the down direction it asks for); a run this stage cannot
        take is answered with ERROR, then refused."""
        try:
            self.start = message(RunStart, meta, "RUN")
            self.run_id = safe_run_id(self.start.run_id)
            # Stage 1 derived the run's deadline from its link; this stage's own --timeout overrides it.
            self.cfg = RunConfig.from_dict(self.start.config, "stage 1's run configuration")
            if timeout_s:
                self.cfg = self.cfg.replace(timeout_s=timeout_s)
            back = Direction.from_dict(self.start.return_link) if self.start.return_link else None
            self.stage = self.builder.stage(self.cfg.cuts, 1)
            self.block_cuts = self.builder.partitioner.block_cuts() if self.cfg.adaptive else None
            if self.block_cuts is not None and self.cfg.cuts[0] not in self.block_cuts:
                raise UsageError(f"an adaptive run starts at a block split, not {self.cfg.cuts[0]!r}")
        except (UsageError, WireError) as exc:
            try:
                self.connection.send(wire.ERROR, meta={"reason": f"stage 2 cannot run this: {exc}"})
            except (ParetoPipeError, OSError):
                pass
            raise WireError(f"stage 1 sent a run stage 2 cannot take: {exc}")
        return back

    def _compute_loop(self) -> None:
        cpushare.join_compute_thread()
        while True:
            item = self.work.get()
            if item is None:
                return
            if isinstance(item, nn.Module):  # a SWITCH, in order between two batches
                self.stage = item
                continue
            f, arrived = item
            try:
                began = time.monotonic()
                out, compute_s = self.timer.run(self.stage, f.tensor, self.builder.device)
                payload = wire.encode_payload(out)
                rec = self.seen[f.seq]
                rec.update(stage2_queue_s=began - arrived, stage2_compute_s=compute_s,
                           stage2_encode_s=payload.encode_s)
                # The activation's buffer goes back to the pool once the result is on the wire: an
                # empty stage 2 (k = K) returns its input itself, sent straight from that buffer.
                meta = {k: rec[k] for k in RESULT_META_FIELDS + (("stage2_open_s",) if self.sealed else ())}
                enc = wire.frame(wire.RESULT, f.seq, payload, meta)
                self.sender.submit(enc, on_sent=self._on_sent(f, rec, enc))
            except BaseException as exc:
                self.compute_error.append(exc)
                return

    def _on_sent(self, f: wire.Frame, rec: dict[str, Any], enc: wire.Encoded) -> Callable[[float], None]:
        measured = f.seq >= self.cfg.warmup

        def sent(_s: float) -> None:
            f.release()
            if self.sealed:
                rec["stage2_seal_s"] = enc.seal_s
            if measured:
                self.meter.end()  # the energy window closes with the last measured result sent
        return sent

    def serve(self) -> tuple[dict[str, Any] | None, BaseException | None]:
        """Batches until stage 1's RECORDS: (stage 1's part or None, the failure or None)."""
        worker = threading.Thread(target=self._compute_loop, name="stage2-compute", daemon=True)
        worker.start()
        failure: BaseException | None = None
        part1 = None
        self.connection.sock.settimeout(self.cfg.timeout_s)
        with SystemMonitor(gpu=self.builder.device.startswith("cuda")) as mon, self.meter:
            try:
                part1 = self._receive()
            except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
                failure = exc
            finally:
                self.work.put(None)
                worker.join(timeout=self.cfg.timeout_s)
                self.sender.close()  # every result is on the wire (the window's end) before the meter stops
        mon.stop()
        self.sysmon = mon.summary()
        return part1, failure

    def _receive(self) -> dict[str, Any]:
        cfg, total = self.cfg, self.cfg.warmup + self.cfg.num_batches
        kinds = (wire.TENSOR, wire.RECORDS) + ((wire.SWITCH, wire.PROBE) if cfg.adaptive else ())
        while True:
            f = wire.expect(self.connection.reader.read(), *kinds)
            if self.compute_error:
                raise self.compute_error[0]
            if self.sender.error is not None:
                raise self.sender.error
            if f.kind == wire.RECORDS:
                return check_part(json_payload(f), "stage 1", True)
            if f.kind == wire.SWITCH:
                self.work.put(_switch_stage(self.builder, f.meta, self.block_cuts))
                self.switches += 1
                continue
            if f.kind == wire.PROBE:
                f.release()
                self.sender.submit(wire.frame(wire.PROBE_ACK, f.seq))
                continue
            if f.seq in self.seen or not 0 <= f.seq < total:
                raise WireError(f"batch {f.seq} sent twice or out of range 0..{total - 1}")
            if f.tensor is None:
                raise WireError(f"batch {f.seq} carries no tensor")
            self.seen[f.seq] = {"seq": f.seq, "warmup": f.seq < cfg.warmup, "stage2_decode_s": f.decode_s,
                                "payload_bytes": f.raw_nbytes, "wire_bytes": f.wire_nbytes}
            if f.seq >= cfg.warmup:
                self.meter.begin()  # the energy window opens with the first measured batch in
            if self.sealed:
                self.seen[f.seq]["stage2_open_s"] = f.open_s
            self.work.put((f, time.monotonic()))

    def part(self, send_back: bool) -> dict[str, Any]:
        """Stage 2's part of the record; its manifest and system metrics also go back to stage 1
        when stage 1 sent its own part (a failed run sends nothing)."""
        manifest = {**self.manifest, "cipher": cipher_usage(self.connection, self.sealed_before),
                    "energy_sensors": self.meter.manifest()}
        resources = self.meter.part(self.cfg.num_batches * self.cfg.batch_size)
        if self.cfg.adaptive:
            manifest = {**manifest, "adaptive": {"switches_applied": self.switches,
                                                 "self_profile": (self.ok_meta or {}).get("profile")}}
        if send_back:
            back: dict[str, Any] = {"manifest": manifest, "sysmon": self.sysmon, "resources": resources}
            if self.sealed:
                back["batches"] = [{"seq": b["seq"], "warmup": b["warmup"], "stage2_seal_s": b.get("stage2_seal_s")}
                                   for b in (self.seen[s] for s in sorted(self.seen))]
            try:
                self.connection.send_json(wire.RECORDS, back)
            except (ParetoPipeError, OSError) as exc:
                log.warning("stage 2: could not send its records to stage 1: %s", exc)
        return {"manifest": manifest, "sysmon": self.sysmon, "batches": [self.seen[s] for s in sorted(self.seen)],
                "resources": resources}


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
