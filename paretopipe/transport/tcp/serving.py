"""The later stages of a TCP run, across runs: each serves the runs that reach it on a connection
until BYE (:class:`.sink.SinkRun`, one run), writes each run's record where the anchor did, and a
middle stage (a chain of more than two: Pi -> Pi -> server) keeps its connection to the next stage
(:class:`.downstream.Downstream`) from run to run, as stage 1 keeps its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ...partition.stages import StageBuilder
from .. import wire
from ..bookkeeping import status_of
from .connection import Connection
from .downstream import Downstream
from .outcome import RunOutcome, assemble_record, merge_peer_seals, write_record
from .sink import SinkRun


def serve_connection(connection: Connection, builder: StageBuilder, *, output_dir: str | Path | None = None,
                     observed_link: dict | None = None, threads: int | None = None,
                     limits: dict[str, Any] | None = None, timeout_s: float | None = None,
                     on_run: Callable[[RunOutcome], None] | None = None,
                     downstream: Downstream | None = None) -> list[RunOutcome]:
    """Serve runs on a connection until the stage before says goodbye; returns their outcomes. A
    failed run raises (after writing its incomplete record); the connection is closed either way.
    With ``downstream`` this is a middle stage: each run's frames go on to the next stage, whose
    results come back through here."""
    outcomes = []
    bye = False
    try:
        while True:
            connection.sock.settimeout(None)  # between runs stage 1 may take as long as it likes
            sealed_before = connection.channel.usage() if connection.channel else None  # a run's share from RUN on
            connection.mark_transport()
            f = connection.reader.read()
            if f.kind == wire.BYE:
                bye = True
                return outcomes
            outcome = _stage_run(connection, builder, wire.expect(f, wire.RUN).meta, output_dir=output_dir,
                                 observed_link=observed_link, threads=threads, limits=limits, timeout_s=timeout_s,
                                 sealed_before=sealed_before, downstream=downstream)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
    finally:
        connection.close()
        if downstream is not None:
            downstream.close(bye)


def _stage_run(connection: Connection, builder: StageBuilder, meta: dict[str, Any], *, output_dir, observed_link,
               threads, limits, timeout_s: float | None, sealed_before: dict[str, Any] | None = None,
               downstream: Downstream | None = None) -> RunOutcome:
    run = SinkRun(connection, builder, meta, timeout_s, threads=threads, limits=limits, sealed_before=sealed_before,
                   downstream=downstream)
    started = time.monotonic()
    part1, failure = run.serve()
    status, error = status_of(failure)
    parts = run.exchange_parts(part1)
    merge_peer_seals(parts)
    record = assemble_record(run.run_id, status, error, run.cfg, parts, observed_link or run.start.link,
                             {"run_wall_s": time.monotonic() - started, "written_by": run.name},
                             run.items.finish_record)
    path = write_record(record, output_dir)
    if failure is not None:
        raise failure
    return RunOutcome(record, path)
