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
from ..runconfig import RunConfig
from ..schedule import status_of
from .connection import Connection, FrameSender
from .messages import RESULT_META_FIELDS, RunStart, check_part, json_payload, message, safe_run_id
from .outcome import RunOutcome, assemble_record, write_record

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
            f = connection.reader.read()
            if f.kind == wire.BYE:
                return outcomes
            outcome = _stage2_run(connection, builder, wire.expect(f, wire.RUN).meta, output_dir=output_dir,
                                  observed_link=observed_link, threads=threads, limits=limits, timeout_s=timeout_s)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
    finally:
        connection.close()


def _stage2_run(connection: Connection, builder: StageBuilder, meta: dict[str, Any], *, output_dir, observed_link,
                threads, limits, timeout_s: float | None) -> RunOutcome:
    try:
        start = message(RunStart, meta, "RUN")
        run_id = safe_run_id(start.run_id)
        # Stage 1 derived the run's deadline from its link; this stage's own --timeout overrides it.
        cfg = RunConfig.from_dict(start.config, "stage 1's run configuration")
        if timeout_s:
            cfg = cfg.replace(timeout_s=timeout_s)
        back = Direction.from_dict(start.return_link) if start.return_link else None
        stage = builder.stage(cfg.cuts, 1)
        block_cuts = builder.partitioner.block_cuts() if cfg.adaptive else None
        if block_cuts is not None and cfg.cuts[0] not in block_cuts:
            raise UsageError(f"an adaptive run starts at a block split, not {cfg.cuts[0]!r}")
    except (UsageError, WireError) as exc:
        try:
            connection.send(wire.ERROR, meta={"reason": f"stage 2 cannot run this: {exc}"})
        except (ParetoPipeError, OSError):
            pass
        raise WireError(f"stage 1 sent a run stage 2 cannot take: {exc}")
    ok_meta = None
    if cfg.adaptive and not cfg.device_profiles:
        ok_meta = {"profile": self_profile_timings(builder, cfg)}
    connection.send(wire.RUN_OK, meta=ok_meta)
    link = EmulatedLink(back, seed=cfg.seed, which="down") if back else None
    timer = StageTimer(builder.device)
    manifest2 = node_manifest(builder.device, threads, role="stage2", weights_fingerprint=builder.fingerprint,
                              limits=limits)
    sender = FrameSender(connection.writer, link, "stage2-send")
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
    connection.sock.settimeout(cfg.timeout_s)
    total = cfg.warmup + cfg.num_batches
    switches = 0
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            while True:
                kinds = (wire.TENSOR, wire.RECORDS) + ((wire.SWITCH, wire.PROBE) if cfg.adaptive else ())
                f = wire.expect(connection.reader.read(), *kinds)
                if compute_error:
                    raise compute_error[0]
                if sender.error is not None:
                    raise sender.error
                if f.kind == wire.RECORDS:
                    part1 = check_part(json_payload(f), "stage 1", True)
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
            connection.send_json(wire.RECORDS, {"manifest": manifest2, "sysmon": part2["sysmon"]})
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
