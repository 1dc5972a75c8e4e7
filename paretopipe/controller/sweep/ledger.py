"""A sweep's account of itself on disk: every run's record written as it ends (atomically; a full
disk stops the sweep with one line), the failures, each configuration's stopping decision, the
time measured against the time spent, and runs.csv and session.json rebuilt from the records.

The loop (:mod:`.sweeper`) decides what to measure; this keeps what was measured. The run
records are the source of truth: a later consolidation rebuilds everything else from them."""

from __future__ import annotations

import errno
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ... import records
from ...analysis.keys import ConfigKey
from ...analysis.session import Session, SessionMeta
from ...errors import ParetoPipeError, UsageError
from ...manifest import node_manifest
from ...records import COMPLETE, INFEASIBLE
from ...runrecord import RunRecord
from .plan import PlannedRun

log = logging.getLogger("paretopipe.sweep")
T = TypeVar("T")


class DiskFullError(ParetoPipeError):
    """No room left to write results: the sweep stops, nothing is retried."""


class SweepLedger:
    """One session's bookkeeping across the sweep's passes (and a search's trials)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.dir = session.path
        self.failures: list[dict[str, Any]] = []
        self.stopping: dict[ConfigKey, dict[str, Any]] = {}
        self.started = time.monotonic()
        self.measured_s = self.reference_s = 0.0
        self.consolidated = float("-inf")

    def begin(self) -> None:
        """A sweep's start: its clock and measured time from zero, its folder made."""
        self.started = time.monotonic()
        self.measured_s = self.reference_s = 0.0
        self.dir.mkdir(parents=True, exist_ok=True)

    def write(self, write: Callable[[], T], path: Path) -> T:
        """Run a write; a full disk becomes one DiskFullError naming the path and the space left."""
        try:
            return write()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(self.dir).free if self.dir.exists() else 0
                raise DiskFullError(f"disk full: cannot write {path} ({free} bytes free on that file system); "
                                    f"free some space and run the sweep again with --resume")
            raise

    def keep(self, planned: PlannedRun, record: RunRecord) -> None:
        """A run's record, on disk before anything else happens (a reference run's apart: it is not
        a run of the sweep)."""
        if planned.reference:
            self.write(lambda: self.session.write_reference(planned.run_key, record.to_dict()),
                       self.session.reference_path(planned.run_key))
        else:
            self.write(lambda: self.session.write_run(planned.run_key, record.to_dict()),
                       self.session.run_path(planned.run_key))
            self.measured_s += record.summary.measuring_s

    def failed(self, run_key: str, attempt: int, error: str) -> None:
        self.failures.append({"run_key": run_key, "attempt": attempt, "error": error, "time_utc": records.utc_now()})

    def resumed(self, run_key: str, resume: bool) -> RunRecord | None:
        """With --resume, a run already complete is taken as it is, not measured again."""
        if not resume or not self.session.completed(run_key):
            return None
        path = self.session.run_path(run_key)
        try:
            return RunRecord.of(self.session.read_run(path), str(path))
        except UsageError as exc:  # a record this version cannot read: measured again, not trusted
            log.warning("%s: measuring it again (%s)", path, exc)
            return None

    def load_meta(self, options: dict[str, Any], networks: dict[str, Any]) -> SessionMeta:
        """session.json's account, carried on from the one on disk when resuming."""
        meta = SessionMeta(schema_version=records.SCHEMA_VERSION, created_utc=records.utc_now(), options=options,
                           manifest=node_manifest(role="controller"), networks=networks)
        try:
            old = self.session.read_meta()
        except UsageError as exc:
            log.warning("%s: starting the session file afresh", exc)
            old = None
        if old is not None:
            meta.created_utc = old.get("created_utc", meta.created_utc)
            meta.resumed_utc = list(old.get("resumed_utc") or []) + [records.utc_now()]
            self.failures = list(old.get("failures") or [])
        return meta

    def write_meta(self, meta: SessionMeta) -> None:
        self.write(lambda: self.session.write_meta(meta), self.session.meta_path)

    def consolidate(self, meta: SessionMeta, final: bool) -> None:
        """runs.csv and session.json after every run; summary.csv (CIs of the medians over runs) at the end."""
        rows, skipped = self.write(lambda: self.session.consolidate(self.failures, final, self.stopping),
                                   self.dir / "runs.csv")
        self.consolidated = time.monotonic()
        wall, measured_s = time.monotonic() - self.started, self.measured_s
        meta.updated_utc, meta.complete = records.utc_now(), final and not meta.interrupted
        meta.runs_complete = sum(r["status"] == COMPLETE for r in rows)
        meta.runs_infeasible = sum(r["status"] == INFEASIBLE for r in rows)
        meta.unreadable_runs, meta.failures = skipped, self.failures
        meta.timing = {"wall_s": wall, "measured_s": measured_s, "reference_s": self.reference_s,
                       "overhead_s": wall - measured_s,
                       "overhead_ratio": (wall - measured_s) / measured_s if measured_s else None,
                       "note": "measured_s sums the measured spans of this invocation's runs (first measured "
                               "batch's start to last completion); overhead is everything else (start-up, model "
                               "builds, warm-up, handshakes, writing, and the drift checks' reference runs, "
                               "reference_s of measuring)"}
        self.write_meta(meta)
