"""A session folder on disk, and the one reader and writer of it.

    SESSION/
      session.json      options, manifests, network conditions, timing, failures
      runs/<run_key>.json   one record per run (the source of truth)
      runs.csv          one row per run
      summary.csv       one row per configuration (medians over runs, 95% CIs)
      failures.csv      every failed attempt
      report/           pareto.csv and the figures

Every file is written atomically, so a killed sweep loses at most the run in flight and a later
consolidation rebuilds the CSVs from the run records. What identifies a configuration is
:mod:`.keys`; the tables' columns :mod:`.columns`; summary.csv's maths :mod:`.summarize`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import records
from ..errors import UsageError
from .columns import FAILURE_FIELDS, RUN_FIELDS, extra_columns, run_row
from .keys import CONFIG_KEY, KEY_DEFAULTS, ConfigKey, table_columns
from .summarize import summarize_runs

log = logging.getLogger("paretopipe.session")

#: Where the tables of a folder of hand-run JSON files go (inside that folder).
CONSOLIDATED = "consolidated"


@dataclasses.dataclass
class GroupMeta:
    """One worker group's account in session.json: how its configurations were ordered and
    stopped, the drift reference, every run key it executed (in order) and its reference runs."""

    order: str
    seed: int
    precision: float | None
    min_runs: int
    max_runs: int
    reference: dict[str, Any]  # {"network": ..., "split": the split's label}
    executed: list[str] = dataclasses.field(default_factory=list)
    reference_runs: list[str] = dataclasses.field(default_factory=list)
    stopping: dict[str, dict[str, Any]] | None = None  # by configuration key text, once the group ends
    drift_checks: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.reference_runs:  # as before: present once a drift check measured the reference
            del out["reference_runs"]
        return {k: v for k, v in out.items() if v is not None or k == "precision"}


@dataclasses.dataclass
class SessionMeta:
    """session.json, the sweep's own account of a session: its options and controller, the network
    conditions, each worker group's (:class:`GroupMeta`), when it was created, resumed and last
    updated, how many runs it recorded, its timing and every failed attempt. The sweeper holds one
    and writes it with :meth:`Session.write_meta`; readers take the JSON object."""

    schema_version: int
    created_utc: str
    options: dict[str, Any]
    manifest: dict[str, Any]
    networks: dict[str, Any]
    resumed_utc: list[str] = dataclasses.field(default_factory=list)
    groups: dict[str, GroupMeta] = dataclasses.field(default_factory=dict)
    updated_utc: str | None = None
    complete: bool = False
    runs_complete: int = 0
    runs_infeasible: int = 0
    unreadable_runs: list[str] = dataclasses.field(default_factory=list)
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    interrupted: bool | None = None  # set when the sweep ends, one way or the other
    progress: dict[str, Any] | None = None  # runs planned so far (a live page's progress and ETA)

    def group(self, name: str, **fields: Any) -> GroupMeta:
        """The group's account, made on its first start; a later start (a retried group) keeps the
        runs it executed and updates the rest."""
        old = self.groups.get(name)
        self.groups[name] = GroupMeta(**fields, executed=old.executed if old else [],
                                      reference_runs=old.reference_runs if old else [])
        return self.groups[name]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "groups":
                value = {name: g.to_dict() for name, g in value.items()}
            if value is None or (f.name in ("resumed_utc", "groups") and not value):
                continue  # absent until it happens, as session.json has always been written
            out[f.name] = value
        return out


class Session:
    """One session folder: where its files are, and how they are read and written."""

    def __init__(self, path: str | Path, runs_dir: str | Path | None = None) -> None:
        self.path = Path(path)
        self._runs_dir = Path(runs_dir) if runs_dir is not None else None
        self._rows: dict[str, tuple[int, dict[str, Any] | None]] = {}

    @classmethod
    def of_run_files(cls, folder: str | Path) -> "Session":
        """A session over a folder of hand-run JSON files (``partition1.py``/``partition2.py --out``,
        ``distributed_runner.py``'s metrics folder, a sweep's ``runs/``): its tables are written to
        ``FOLDER/consolidated/``, the same runs.csv and summary.csv a sweep writes."""
        session = cls(Path(folder) / CONSOLIDATED, runs_dir=folder)
        rows, _ = session.consolidate([], final=True)
        if not rows:
            raise UsageError(f"{folder} holds no readable run records (*.json from partition1.py/partition2.py, "
                             f"distributed_runner.py or a sweep's runs/)")
        return session

    # -- layout --------------------------------------------------------------------------------
    @property
    def runs_dir(self) -> Path:
        return self._runs_dir if self._runs_dir is not None else self.path / "runs"

    @property
    def meta_path(self) -> Path:
        return self.path / "session.json"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    def run_path(self, key: str) -> Path:
        return self.runs_dir / f"{key}.json"

    def reference_path(self, key: str) -> Path:
        """A drift check's re-measurement of the reference configuration: kept apart from the runs."""
        return self.path / "reference" / f"{key}.json"

    def drifted_path(self, key: str) -> Path:
        """Where a run measured during drift is set aside (kept, out of the summaries)."""
        return self.path / "drifted" / f"{key}.json"

    def trace_control_path(self, name: str) -> Path:
        """The log of rates a trace controller applied to a shaped link (``name``: a file label)."""
        return self.path / "trace-control" / f"{records.file_label(name)}.csv"

    def measured_anything(self) -> bool:
        """Whether any run, or any reference run, was recorded here."""
        return any(self.runs_dir.glob("*.json")) or any((self.path / "reference").glob("*.json"))

    # -- run records ---------------------------------------------------------------------------
    def write_run(self, key: str, record: dict[str, Any]) -> Path:
        return records.write_run_json(self.run_path(key), record)

    def write_reference(self, key: str, record: dict[str, Any]) -> Path:
        return records.write_run_json(self.reference_path(key), record)

    def set_aside(self, key: str) -> None:
        """Move a run measured during drift out of ``runs/`` into ``drifted/``."""
        src = self.run_path(key)
        if src.exists():
            dst = self.drifted_path(key)
            dst.parent.mkdir(parents=True, exist_ok=True)
            src.replace(dst)

    def read_run(self, path: Path) -> dict[str, Any] | None:
        """A run record, or None (with a warning) when it is truncated or not a record."""
        try:
            rec = json.loads(path.read_text())
            if not isinstance(rec, dict) or not isinstance(rec.get("summary"), dict) \
                    or not isinstance(rec.get("config"), dict):
                raise ValueError("not a run record")
            return rec
        except (OSError, ValueError, RecursionError) as exc:
            log.warning("skipping %s: unreadable run record (%s)", path, exc)
            return None

    def completed(self, key: str) -> bool:
        rec = self.read_run(self.run_path(key)) if self.run_path(key).exists() else None
        return bool(rec) and rec.get("status") in ("complete", "infeasible")

    def run_rows(self) -> tuple[list[dict[str, Any]], list[str]]:
        """runs.csv rows from every run record (each file parsed once until it changes), and the
        names of records that could not be read."""
        skipped = []
        present = set()
        for path in sorted(self.runs_dir.glob("*.json")):
            present.add(path.name)
            stamp = path.stat().st_mtime_ns
            if self._rows.get(path.name, (None,))[0] != stamp:
                self._rows[path.name] = (stamp, self._row_of(path))
            if self._rows[path.name][1] is None:
                skipped.append(path.name)
        for name in set(self._rows) - present:
            del self._rows[name]
        rows, seen = [], set()
        for _, (_, row) in sorted(self._rows.items()):
            # Both stages of a hand run may write the same run's record: one row per run.
            if row is not None and row["run_key"] not in seen:
                seen.add(row["run_key"])
                rows.append(row)
        return rows, skipped

    def _row_of(self, path: Path) -> dict[str, Any] | None:
        rec = self.read_run(path)
        if rec is None:
            return None
        try:
            return run_row(rec, f"runs/{path.name}" if self._runs_dir is None else str(path.resolve()))
        except (KeyError, TypeError, AttributeError) as exc:  # JSON with a summary, but not ours
            log.warning("skipping %s: not a ParetoPipe run record (no %s)", path, exc)
            return None

    # -- consolidated files --------------------------------------------------------------------
    def consolidate(self, failures: Iterable[dict[str, Any]], final: bool,
                    stopping: dict[ConfigKey, dict[str, Any]] | None = None
                    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Rewrite runs.csv and failures.csv (and summary.csv when ``final``). ``stopping``: why each
        configuration stopped being measured."""
        rows, skipped = self.run_rows()
        records.atomic_write_csv(self.path / "runs.csv", rows, RUN_FIELDS + extra_columns(rows))
        if final:
            summary = summarize_runs(rows)
            for entry in summary:
                entry.update((stopping or {}).get(ConfigKey.of(entry), {}))
            records.atomic_write_csv(self.path / "summary.csv", summary, table_columns(summary))
        records.atomic_write_csv(self.path / "failures.csv", list(failures), FAILURE_FIELDS)
        return rows, skipped

    def read_meta(self) -> dict[str, Any] | None:
        try:
            meta = json.loads(self.meta_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UsageError(f"{self.meta_path} is not readable JSON ({exc}); it is not a sweep session")
        if not isinstance(meta, dict):
            raise UsageError(f"{self.meta_path} is not a session file")
        return meta

    def write_meta(self, meta: SessionMeta | dict[str, Any]) -> Path:
        return records.atomic_write_json(self.meta_path, meta.to_dict() if isinstance(meta, SessionMeta) else meta)

    # -- reading for analysis ------------------------------------------------------------------
    def runs(self):
        """runs.csv as a DataFrame, with ``latency_s`` = each run's median latency."""
        return _with_latency(_read_csv(self.path / "runs.csv"))

    def configs(self):
        """summary.csv as a DataFrame, with ``latency_s`` = the configuration's median latency."""
        summary = _read_csv(self.path / "summary.csv", fill=("in_flight",))
        if "in_flight" not in summary.columns:
            # A summary from before the in-flight depth was in the key: its runs.csv has each run's.
            runs = _read_csv(self.path / "runs.csv")
            others = [k for k in CONFIG_KEY if k != "in_flight"]
            depth = runs.drop_duplicates(others).set_index(others)["in_flight"]
            summary["in_flight"] = [int(depth.get(tuple(r), 1)) for r in summary[others].itertuples(index=False)]
        return _with_latency(summary)


def _with_latency(table):
    """``table`` with ``latency_s``, the column the fronts call latency (a wide table of strings is
    one block per column: a new column is joined, not inserted)."""
    import pandas as pd

    return pd.concat([table, table["latency_median_s"].rename("latency_s")], axis=1)


def _read_csv(path: Path, fill: Sequence[str] = ()):
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise UsageError(f"{path} not found: is {path.parent} a finished sweep session?")
    except pd.errors.EmptyDataError:
        raise UsageError(f"{path} is empty: no run of {path.parent} was recorded (its failures.csv says why); "
                         f"give a session that measured runs")
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a readable CSV ({str(exc).splitlines()[0]}); rebuild it with a "
                         f"sweep --resume of that session")
    # A session from before ciphers, transports or codecs were in the key: plain, raw TCP (or
    # RPC) and float32 uncompressed throughout.
    df = df.copy()  # pandas 3 reads a CSV as one block per column; a wide table is consolidated once here
    missing_keys = {c: d for c, d in KEY_DEFAULTS.items() if c not in df.columns and c not in fill}
    if missing_keys:  # one new block, not a column at a time (a wide table would fragment)
        df = pd.concat([df, pd.DataFrame(missing_keys, index=df.index)], axis=1)
    needed = {"latency_median_s", *CONFIG_KEY} - set(fill)
    missing = sorted(needed - set(df.columns))
    if missing:
        raise UsageError(f"{path} lacks the column {missing[0]!r}: not a ParetoPipe session (or an older one)")
    return df


def sessions_under(root: str | Path, holding: str = "runs.csv") -> list[Path]:
    """The session folders directly under a results folder that hold ``holding``, oldest first by
    their last write (a folder's mtime: every atomic write renames a file into it). The one
    definition of "the newest session" for --resume, report and compare; the consolidated view of
    hand-run records is not a session."""
    return sorted((p.parent for p in Path(root).glob(f"*/{holding}") if p.parent.name != CONSOLIDATED),
                  key=lambda p: p.stat().st_mtime)


def sweep_session_dir(out_dir: str, session: str | None, resume: bool) -> Path:
    """A sweep's session folder: ``--session`` under ``--out``, the newest one for ``--resume``, or a new
    timestamped one."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the sessions")
    if session:
        if "/" in session or session in (".", ".."):
            raise UsageError(f"--session {session!r}: a folder name, not a path")
        return out / session
    if resume:
        sessions = sessions_under(out, "session.json")
        if not sessions:
            raise UsageError(f"--resume: no session found under {out}; give the --out of an earlier sweep")
        return sessions[-1]
    return out / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def find_session(path: str | Path) -> Session:
    """A session folder itself, the newest session inside a results folder, or a folder of
    hand-run JSON files (consolidated into ``FOLDER/consolidated/``)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"no sweep results under {path}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{path} is a file; give a session folder or a results folder")
    if (path / "runs.csv").is_file():
        return Session(path)
    if any(path.glob("*.json")):  # hand-run records: consolidated afresh, new files included
        return Session.of_run_files(path)
    sessions = sessions_under(path)
    if not sessions:
        raise UsageError(f"no sweep results under {path} (expected runs.csv in it or in a session folder inside)")
    return Session(sessions[-1])
