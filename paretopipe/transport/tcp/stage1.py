"""One run as stage 1 of a TCP pipeline: over an established connection (a sweep's worker, whose
connection outlives its runs), or from a listener (``partition1.py``); the run itself is
:class:`.source.Stage1Run`, and its record is assembled and written here."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ... import engines, records
from ...compute import cpushare, cputrace
from ...errors import ParetoPipeError
from ...manifest import node_manifest
from ...network.conditions import NetworkConditions
from ...partition.stages import StageBuilder
from ...sysmon import SystemMonitor
from .. import fidelity
from ..policy import SplitPolicy, StaticPolicy
from ..resources import stage_meter
from ..runconfig import RunConfig
from ..bookkeeping import measured_images, status_of
from .connection import Connection
from .handshake import StageListener
from .outcome import RunOutcome, assemble_record, cipher_usage, link_manifest_of, write_record
from .promptrun import PromptStage1Run
from .source import Stage1Run

log = logging.getLogger("paretopipe.tcp")


def run_on_connection(connection: Connection, builder: StageBuilder, cfg: RunConfig, *,
                      policy: SplitPolicy | None = None, listener: StageListener | None = None,
                      conditions: NetworkConditions | None = None, observed_link: dict | None = None,
                      threads: int | None = None, limits: dict[str, Any] | None = None,
                      keep_outputs: bool = False, output_dir: str | Path | None = None,
                      cpu_traces: Sequence[cputrace.StageTrace] = (),
                      on_fault: Callable[[dict[str, Any]], None] | None = None) -> RunOutcome:
    """One run as stage 1 over an established connection, its split decided by ``policy`` (by
    default the run's own cuts). The record is written into ``output_dir`` (if given) even when the
    run fails: ``"status": "incomplete"`` with the batches that completed; the error is raised
    afterwards, and the connection is then closed. A guarded run may end on a stage 2 that came
    back to ``listener``: the outcome's ``connection`` is the one still open, for the next run.
    ``cpu_traces`` replay compute traces on stages' groups from the batches' first instant;
    ``on_fault`` applies the run's fault to stage 2 (:mod:`paretopipe.faults`)."""
    policy = policy or StaticPolicy(cfg.cuts)
    cfg = fidelity.chosen(builder, cfg)  # --wire-dtype auto: chosen before RUN tells stage 2
    if not engines.only_torch(cfg.engine):  # exported and checked before the clock starts
        builder.stage_for(cfg, 0)
    run_id = records.new_run_id(builder.name, cfg.split_index if policy.adaptive else cfg.cuts[0])
    emulated = conditions is not None and cfg.link_mode == "emulated"
    manifest1 = node_manifest(builder.device, threads, role="stage1", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    link_manifest = link_manifest_of(conditions, emulated, observed_link)
    later: list[dict[str, Any]] = []
    started = time.monotonic()
    sealed_before = connection.channel.usage() if connection.channel else None
    connection.mark_transport()
    meter = stage_meter(builder, cfg, 0)  # before RUN: a first run measures idle power while stage 2 is idle too
    endpoint = PromptStage1Run if cfg.workload.generates else Stage1Run
    run = endpoint(connection, builder, cfg, policy, run_id=run_id, conditions=conditions if emulated else None,
                   link_manifest=link_manifest, listener=listener, keep_outputs=keep_outputs, meter=meter,
                   cpu_traces=cputrace.Replays(cpu_traces, cfg.seed) if cpu_traces else None, on_fault=on_fault)
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon, meter:
        failure = _drive(run, run_id)
    mon.stop()
    status, error = status_of(failure)
    manifest1 = {**manifest1, "cipher": cipher_usage(connection, sealed_before),
                 "transport": connection.transport_usage(),
                 "engine": run.stage_engine()}
    part1 = _part1(run, manifest1, mon)
    if failure is None and run.next is not None:
        try:
            later = run.exchange(part1)
        except (ParetoPipeError, OSError) as exc:
            log.warning("stage 1: records exchange with stage 2 failed: %s", exc)
            failure = exc
    after = run.finish(failure is None)
    if failure is None and status == "complete":
        part1["fidelity"] = fidelity.figures(builder, cfg)
    record = assemble_record(run_id, status, error, cfg, [part1, *later], link_manifest,
                             {"run_wall_s": time.monotonic() - started, "written_by": "stage1"},
                             run.finish_record, loadgen=run.harness)
    path = write_record(record, output_dir)
    if failure is not None and status == "incomplete":  # "infeasible" is a measured outcome
        raise failure
    outputs = [run.outputs[s] for s in sorted(run.outputs)] if keep_outputs else None
    return RunOutcome(record, path, outputs, after)


def _drive(run: Stage1Run, run_id: str) -> BaseException | None:
    """Start the run on the next stage and run its batches; what ended it early (None: nothing)."""
    try:
        # The self-profile, data generation and stage 1 run on this thread, under the stage's CPU share.
        cpushare.join_compute_thread()
        run.open()
        log.info("%s: run %s started with %s", "adaptive" if run.policy.adaptive else "stage 1", run_id,
                 run.first_connection.address)
        run.run()
    except (ParetoPipeError, OSError, KeyboardInterrupt) as exc:
        return exc
    return None


def _part1(run: Stage1Run, manifest: dict[str, Any], mon: SystemMonitor) -> dict[str, Any]:
    """Stage 1's part of the record: its manifest, system monitor, batches, resources and, for a
    generation, the streams' tokens and the stage's own figures."""
    batches = run.book.records()
    part = {"manifest": {**manifest, "energy_sensors": run.meter.manifest(), **run.manifest_part()},
            "sysmon": mon.summary(), "batches": batches, "resources": run.meter.part(measured_images(batches, run.cfg))}
    part.update(run.workload_part())
    if run.fault is not None:
        part["fault"] = run.fault.figures([b for b in batches if not b.get("warmup")], run.cfg.num_batches)
    return part


def run_stage1(listener: StageListener, builder: StageBuilder, cfg: RunConfig, *, connect_timeout: float = 60.0,
               policy: SplitPolicy | None = None, **kw: Any) -> RunOutcome:
    """One run as stage 1: wait for an authenticated stage 2 whose cuts fit, run, say goodbye. A
    guarded run (adaptive, or with a deadline) takes a stage 2 that comes back on ``listener``."""
    if not (policy and policy.adaptive):  # an adaptive stage 2 starts at whichever split stage 1 says
        listener.expected_cuts = list(cfg.cuts)
    connection = listener.connection(connect_timeout)
    try:
        outcome = run_on_connection(connection, builder, cfg, policy=policy, listener=listener, **kw)
    finally:
        connection.close(bye=True)
    if outcome.connection is not None:
        outcome.connection.close(bye=True)
    return outcome
