"""Stage 1 of a TCP run, the data source: it reads the inputs, computes its part, keeps up to
``in_flight`` batches outstanding and stamps each one's latency on its own clock alone (a run's
frames are drawn in the package's docstring)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ... import cpushare, records
from ...errors import ParetoPipeError
from ...manifest import node_manifest
from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink
from ...partition.stages import StageBuilder, StageTimer
from ...sysmon import SystemMonitor
from .. import wire
from ..endpoint import SourceEndpoint
from ..resources import ResourceMeter, stage_meter
from ..runconfig import RunConfig
from ..schedule import BatchSchedule, status_of
from .connection import Connection, FrameSender
from .handshake import StageListener
from .messages import check_part, read_result_meta
from .outcome import (RunOutcome, assemble_record, cipher_usage, later_parts, link_manifest_of, merge_peer_seals,
                      write_record)

log = logging.getLogger("paretopipe.tcp")


class _Stage1Run(SourceEndpoint):
    """Stage 1's endpoint: computes its part, sends it to stage 2 through the run's sender, and
    takes every result off the connection on a thread of its own as it arrives."""

    def __init__(self, connection: Connection, builder: StageBuilder, cfg: RunConfig, link: EmulatedLink | None,
                 keep_outputs: bool, meter: ResourceMeter) -> None:
        schedule = BatchSchedule(cfg)
        super().__init__(cfg, builder.input_size, schedule, cfg.timeout_s * (1 + schedule.total))
        self.connection, self.builder, self.link = connection, builder, link
        self.keep_outputs = keep_outputs
        self.stage = builder.stage(cfg.cuts, 0)
        self.num_stages = len(cfg.cuts) + 1
        self.timer = StageTimer(builder.device)
        self.codec = wire.Codec(cfg.compression, cfg.compression_level, cfg.wire_dtype)
        # The energy window: the first measured batch's start to the last one's result.
        schedule.on_measured_start, schedule.on_measured_complete = meter.begin, meter.end
        self.outputs: dict[int, torch.Tensor] = {}
        self.error: BaseException | None = None
        self.sender: FrameSender | None = None
        self.sealed = connection.channel is not None
        self.out: torch.Tensor | None = None

    def _receive(self) -> None:
        try:
            for _ in range(self.schedule.total):
                f = wire.expect(self.connection.reader.read(), wire.RESULT)
                # The reader has decoded the result already: now is when it is usable.
                now = time.monotonic()
                fields = read_result_meta(f.meta, self.num_stages, self.sealed)
                if self.sealed:
                    fields["result_open_s"] = f.open_s
                if self.num_stages > 2:  # what crossed each hop, the result's way back last
                    rec = self.schedule.batches.get(f.seq, {})
                    fields["hop_bytes"] = [rec.get("wire_bytes")] + [
                        fields[f"stage{j}_wire_bytes"] for j in range(2, self.num_stages)] + [f.wire_nbytes]
                if self.keep_outputs:
                    self.outputs[f.seq] = tuple(t.clone() for t in f.tensor) if isinstance(f.tensor, tuple) \
                        else f.tensor.clone()
                self.schedule.complete(f.seq, now, result_decode_s=f.decode_s, result_wire_bytes=f.wire_nbytes,
                                       **fields)
                f.release()
        except BaseException as exc:
            self.error = exc
            self.schedule.unblock()

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.sender is not None and self.sender.error is not None:
            raise self.sender.error

    def _on_sent(self, rec: dict[str, Any], enc: wire.Encoded) -> Callable[[float], None]:
        """Stamps a batch's send time (and, sealed, what sealing took, which is part of it)."""
        if self.sealed:
            return lambda s: rec.update(stage1_send_s=s, stage1_seal_s=enc.seal_s)
        return lambda s: rec.__setitem__("stage1_send_s", s)

    def compute(self, seq: int) -> None:
        self.out, compute_s = self.timer.run(self.stage, self.x, self.builder.device)
        self.rec["stage1_compute_s"] = compute_s

    def send(self, seq: int) -> None:
        enc = wire.frame(wire.TENSOR, seq, wire.encode_payload(self.out, self.codec))
        self.rec.update(stage1_encode_s=enc.encode_s, payload_bytes=enc.raw_nbytes, wire_bytes=enc.wire_nbytes)
        self.sender.submit(enc, on_sent=self._on_sent(self.rec, enc))

    def run(self) -> None:
        cpushare.join_compute_thread()  # data generation and stage 1 run on this thread
        self.sender = FrameSender(self.connection.writer, self.link, "stage1-send")
        receiver = threading.Thread(target=self._receive, name="stage1-recv", daemon=True)
        receiver.start()
        try:
            super().run()
        finally:
            self.sender.close()
            receiver.join(1.0)


def run_on_connection(connection: Connection, builder: StageBuilder, cfg: RunConfig, *,
                      conditions: NetworkConditions | None = None, observed_link: dict | None = None,
                      threads: int | None = None, limits: dict[str, Any] | None = None,
                      keep_outputs: bool = False, output_dir: str | Path | None = None) -> RunOutcome:
    """One run as stage 1 over an established connection. The record is written into ``output_dir``
    (if given) even when the run fails: ``"status": "incomplete"`` with the batches that completed;
    the error is raised afterwards, and the connection is then closed."""
    run_id = records.new_run_id(builder.name, cfg.cuts[0])
    emulated = conditions is not None and cfg.link_mode == "emulated"
    link = EmulatedLink(conditions.up, seed=cfg.seed) if emulated else None
    manifest1 = node_manifest(builder.device, threads, role="stage1", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    link_manifest = link_manifest_of(conditions, emulated, observed_link, link)
    failure: BaseException | None = None
    later: list[dict[str, Any]] = []
    run: _Stage1Run | None = None
    started = time.monotonic()
    sealed_before = connection.channel.usage() if connection.channel else None
    connection.sock.settimeout(cfg.timeout_s)
    meter = stage_meter(builder, cfg, 0)  # before RUN: a first run measures idle power while stage 2 is idle too
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon, meter:
        try:
            connection.send(wire.RUN, meta=run_start(run_id, cfg, link_manifest, conditions if emulated else None))
            wire.expect(connection.reader.read(time.monotonic() + cfg.timeout_s), wire.RUN_OK)
            run = _Stage1Run(connection, builder, cfg, link, keep_outputs, meter)
            log.info("stage 1: run %s started with %s", run_id, connection.address)
            run.run()
        except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
            failure = exc
    mon.stop()
    status, error = status_of(failure)
    part1 = {"manifest": {**manifest1, "cipher": cipher_usage(connection, sealed_before),
                          "energy_sensors": meter.manifest()}, "sysmon": mon.summary(),
             "batches": run.schedule.records() if run else [],
             "resources": meter.part(cfg.num_batches * cfg.batch_size)}
    if failure is None:
        # Stage 1's part to stage 2 (which writes the record where the anchor did); stage 2's manifest
        # and system metrics back.
        try:
            connection.send_json(wire.RECORDS, part1)
            back = check_part(connection.recv_json(wire.RECORDS, time.monotonic() + cfg.timeout_s), "stage 2", False)
            later = later_parts(back, 2, len(cfg.cuts) + 1)
            merge_peer_seals([part1, *later])
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 1: records exchange with stage 2 failed: %s", exc)
            failure = exc
    if failure is not None:
        connection.close()
    connection.runs += 1
    record = assemble_record(run_id, status, error, cfg, [part1, *later], link_manifest,
                             {"run_wall_s": time.monotonic() - started, "written_by": "stage1"})
    path = write_record(record, output_dir)
    if failure is not None and status == "incomplete":  # "infeasible" is a measured outcome
        raise failure
    outputs = [run.outputs[s] for s in sorted(run.outputs)] if keep_outputs and run else None
    return RunOutcome(record, path, outputs)


def run_start(run_id: str, cfg: RunConfig, link_manifest: dict[str, Any],
              conditions: NetworkConditions | None) -> dict[str, Any]:
    """Stage 1's RUN meta for stage 2: ``conditions`` when the link is emulated (each hop's frames
    take the up direction, the results on their way back the down). A middle stage passes it on
    with the next stage's number."""
    meta: dict[str, Any] = {"run_id": run_id, "config": cfg.to_dict(), "link": link_manifest,
                            "return_link": conditions.down.to_dict() if conditions else None}
    if len(cfg.cuts) > 1:  # a chain: the receiving stage's place and its own forward direction
        meta.update(stage=1, forward_link=conditions.up.to_dict() if conditions else None)
    return meta


def run_stage1(listener: StageListener, builder: StageBuilder, cfg: RunConfig, *, connect_timeout: float = 60.0,
               **kw: Any) -> RunOutcome:
    """One run as stage 1: wait for an authenticated stage 2 whose cuts fit, run, say goodbye."""
    listener.expected_cuts = list(cfg.cuts)
    connection = listener.connection(connect_timeout)
    try:
        return run_on_connection(connection, builder, cfg, **kw)
    finally:
        connection.close(bye=True)


