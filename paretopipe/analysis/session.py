"""A session folder on disk, and the one reader and writer of it.

    SESSION/
      session.json      options, manifests, network conditions, timing, failures
      runs/<run_key>.json   one record per run (the source of truth)
      runs.csv          one row per run
      summary.csv       one row per configuration (medians over runs, 95% CIs)
      failures.csv      every failed attempt
      report/           pareto.csv and the figures

Every file is written atomically, so a killed sweep loses at most the run in flight and a later
consolidation rebuilds the CSVs from the run records. The configuration key (what identifies a
configuration across runs) is defined here once.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import records
from ..errors import UsageError
from ..network.labels import link_label
from ..splits import Split, sort_key

log = logging.getLogger("paretopipe.session")

#: Where the tables of a folder of hand-run JSON files go (inside that folder).
CONSOLIDATED = "consolidated"
#: A configuration's cipher when its record (or a table from before encryption) names none.
PLAIN = "none"
#: A configuration's transport when its record (or a table from before transports) names none.
RAW_TCP = "tcp"


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """What identifies a configuration: runs of one configuration differ only in ``run``. The one
    statement of it: its fields, in order, are summary.csv's key columns (:data:`CONFIG_KEY`, what
    tables group by); :attr:`text` is its form in file names, run keys and failures.csv; the
    sweeper keys each configuration's stopping rule by it."""

    model: str
    backend: str
    cipher: str
    transport: str
    network: str
    batch_size: int
    split_index: Any  # the split's label (:attr:`paretopipe.splits.Split.label`): 3, "3,9", a cut, "adaptive"
    codec: str = "float32/none"  # how activations travel: --wire-dtype/--compression (a search may vary it)
    in_flight: int = 1           # --in-flight (a search may vary it)
    scenario: str = "closed"     # the LoadGen scenario (paretopipe.loadgen), or the closed loop

    def __post_init__(self) -> None:
        object.__setattr__(self, "split_index", split_label(self.split_index))

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "ConfigKey":
        """The key of a runs.csv or summary.csv row (or a run row before it is written)."""
        return cls(*key_values(row))

    @property
    def text(self) -> str:
        """``model_backend_network_k03[_cipher][_transport]``: without the batch size, which one sweep fixes."""
        return config_key(self.model, self.backend, self.network, self.split_index, self.cipher, self.transport,
                          self.codec, scenario=self.scenario)


CONFIG_KEY = [f.name for f in dataclasses.fields(ConfigKey)]
DEFAULT_CODEC = "float32/none"
#: A configuration measured by the suite's own closed loop, not under a LoadGen scenario.
CLOSED_LOOP = "closed"
#: What a row from before ciphers, transports, codecs or scenarios in the key means by their absence.
KEY_DEFAULTS = {"cipher": PLAIN, "transport": RAW_TCP, "codec": DEFAULT_CODEC, "in_flight": 1, "scenario": CLOSED_LOOP}


def key_values(row: Mapping[str, Any]) -> tuple:
    """A row's :data:`CONFIG_KEY` values in order (a row from before ciphers, transports, codecs or
    in-flight depths in the key: plain, raw TCP, float32 uncompressed, one in flight)."""
    return tuple(row[k] if k in row and row[k] == row[k] else KEY_DEFAULTS[k] for k in CONFIG_KEY)
#: One panel of figures: every network and split of one model, backend, cipher, transport and batch size.
PANEL_KEY = ["model", "backend", "cipher", "transport", "batch_size", "codec", "in_flight", "scenario"]
RUN_FIELDS = ["run_key", "config_key", "model", "backend", "network", "split_index", "cut", "run", "status",
              "batch_size", "in_flight", "cipher", "transport", "codec", "scenario", "latency_median_s", "latency_mean_s", "latency_p95_s",
              "throughput_imgs_per_s", "transfer_median_s", "stage1_compute_median_s",
              "stage2_compute_median_s", "stage2_queue_median_s", "payload_bytes_mean", "wire_bytes_mean",
              "goodput_mbit_per_s", "result_wire_bytes_mean", "measured_window_s", "measured_span_s",
              "batches_measured", "link_mode", "throttled", "error", "json"]
FAILURE_FIELDS = ["run_key", "attempt", "error", "time_utc"]
#: Per-batch means of the latency's parts (every stage's compute, codecs and queue, the transfer):
#: they add up to ``latency_mean_s`` exactly, so the breakdown figure stacks them.
BREAKDOWN = re.compile(r"^(stage\d+_(compute|encode|decode|queue|seal|open)|result_(decode|open)|transfer)_mean_s$")


#: A run's energy and memory figures (energy.summary): runs.csv keeps each; summary.csv gives the
#: objectives (joules per image, peak memory) a median with a 95% CI over runs, the rest a median.
RESOURCES = re.compile(r"^(stage\d+_|link_)?(energy_\w+|idle_power_w|cpu_s|peak_rss_bytes|param_bytes|"
                       r"activation_peak_bytes|model_bytes|cuda_peak_bytes|memory_limit_bytes|over_memory_limit|"
                       r"memory_peak_bytes|memory_model_bytes|memory_fits)$")
RESOURCE_OBJECTIVE = re.compile(r"^((stage\d+_)?energy(_modelled)?_per_image_j|(stage\d+_)?(peak_rss|model)_bytes|"
                                r"memory_(peak|model)_bytes)$")
_UNIT = re.compile(r"_(j|bytes)$")


def _loadgen_entry(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary.csv's LoadGen columns of one configuration: each figure's median over its runs, and
    LoadGen's verdict (VALID only when every run was, else the last INVALID run's reason)."""
    entry: dict[str, Any] = {}
    for metric in sorted({k for m in members for k in m if k.startswith("loadgen_")}):
        values = [m.get(metric) for m in members if m.get(metric) is not None and m.get(metric) == m.get(metric)]
        numbers = [float(v) for v in values if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(values):
            entry[metric] = float(np.median(numbers))
        else:
            entry[metric] = values[-1] if values else None
    results = [m.get("loadgen_result") for m in members if m.get("loadgen_result")]
    if results:
        invalid = [m for m in members if m.get("loadgen_result") == "INVALID"]
        entry["loadgen_result"] = "INVALID" if invalid else "VALID"
        entry["loadgen_invalid_reason"] = invalid[-1].get("loadgen_invalid_reason") if invalid else None
    return entry


def _resource_entry(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary.csv's energy and memory columns of one configuration (none for older records)."""
    entry: dict[str, Any] = {}
    for metric in sorted({k for m in members for k in m if RESOURCES.match(k)}):
        values = [m.get(metric) for m in members if m.get(metric) is not None and m.get(metric) == m.get(metric)
                  and m.get(metric) != ""]
        if metric.endswith(("over_memory_limit", "memory_fits")):  # one run over the limit is over
            flags = [str(v).lower() in ("true", "1") for v in values]
            entry[metric] = (any(flags) if metric.endswith("over_memory_limit") else all(flags)) if flags else None
            continue
        if metric.endswith("_source"):  # where a modelled constant came from: text, the same every run
            entry[metric] = values[0] if values else None
            continue
        xs = [float(v) for v in values]
        entry[metric] = float(np.median(xs)) if xs else None
        if RESOURCE_OBJECTIVE.match(metric):
            stem, unit = _UNIT.sub("", metric), _UNIT.search(metric).group(0)
            entry[f"{stem}_ci95_low{unit}"], entry[f"{stem}_ci95_high{unit}"] = records.median_ci(xs)
    return entry


def config_key(model: str, backend: str, network: str, split: Any, cipher: str = PLAIN,
               transport: str = RAW_TCP, codec: str = DEFAULT_CODEC, batch_tag: int | None = None,
               in_flight_tag: int | None = None, scenario: str = CLOSED_LOOP) -> str:
    """The text form of a configuration (file names, failures.csv); a sealed one ends in its cipher,
    one over another transport than raw TCP in the transport's name, then another codec than
    float32 uncompressed (``_float16-zstd``), and a batch size and an in-flight depth where a search
    session holds several (``_b4``, ``_w2``), and a LoadGen scenario (``_server``): a sweep's names
    are what they were before codecs were in the key."""
    k = Split.of(split).key
    return records.file_label(f"{model}_{backend}_{network}_{k}" + (f"_{cipher}" if cipher != PLAIN else "")
                              + (f"_{transport}" if transport != RAW_TCP else "")
                              + (f"_{codec.replace('/', '-')}" if codec != DEFAULT_CODEC else "")
                              + (f"_b{int(batch_tag)}" if batch_tag is not None else "")
                              + (f"_w{int(in_flight_tag)}" if in_flight_tag is not None else "")
                              + (f"_{scenario}" if scenario != CLOSED_LOOP else ""))


def panel_names(key: Sequence[Any], depths: bool = False) -> tuple[str, str]:
    """(title, file stem) of one panel of figures, a ``PANEL_KEY`` tuple; a plain panel keeps the
    names it had before ciphers."""
    model, backend, cipher, transport, batch, *rest = key
    codec = rest[0] if rest else DEFAULT_CODEC
    # The in-flight depth is named only where the table holds several (``depths``, a search that
    # varied it): a sweep's figures keep the names they had before it was in the key.
    depth = int(rest[1]) if depths and len(rest) > 1 and rest[1] == rest[1] else 1
    scenario = rest[2] if len(rest) > 2 and isinstance(rest[2], str) else CLOSED_LOOP
    sealed = cipher not in (PLAIN, None) and cipher == cipher  # NaN: a table without the column
    carried = transport not in (RAW_TCP, None) and transport == transport
    coded = codec not in (DEFAULT_CODEC, None) and codec == codec
    title = (f"{model}, {backend} backend" + (f" over {transport}" if carried else "")
             + (f", sealed with {cipher}" if sealed else "") + f", batch {batch}" + (f", {codec}" if coded else "")
             + (f", {depth} in flight" if depth != 1 else "")
             + (f", under LoadGen {scenario}" if scenario != CLOSED_LOOP else ""))
    return title, records.file_label(f"{model}_{backend}" + (f"_{cipher}" if sealed else "")
                                     + (f"_{transport}" if carried else "") + f"_b{batch}"
                                     + (f"_{str(codec).replace('/', '-')}" if coded else "")
                                     + (f"_w{depth}" if depth != 1 else "")
                                     + (f"_{scenario}" if scenario != CLOSED_LOOP else ""))


def run_key(cfg_key: str, run: int) -> str:
    return f"{cfg_key}_r{run}"


def split_label(split: Any) -> Any:
    """runs.csv's ``split_index`` of a record's split (:attr:`Split.label`); none stays none."""
    return None if split is None else Split.of(split).label


#: Block splits in numeric order, then N-stage plans, then ``adaptive`` (any written form).
split_sort_key = sort_key


def ordered_splits(values: Iterable[Any]) -> list[Any]:
    return sorted(dict.fromkeys(values), key=split_sort_key)


def run_row(rec: dict[str, Any], name: str) -> dict[str, Any]:
    """One runs.csv row from a run record (the record's own fields, never its file name)."""
    s, c = rec["summary"], rec["config"]
    return {"run_key": c.get("run_key") or rec["run_id"], "config_key": c.get("config_key") or rec["run_id"],
            "model": c["model"], "backend": rec["backend"],
            "network": c.get("network") or link_label(rec["manifest"]["link"]),
            "split_index": split_label(c.get("split_index")), "cut": ",".join(c.get("cuts", [])), "run": c.get("run"),
            "status": rec["status"], "batch_size": c["batch_size"], "in_flight": c["in_flight"],
            "cipher": cipher_of(rec["manifest"]), "transport": transport_of(rec["manifest"]),
            "codec": f"{c.get('wire_dtype') or 'float32'}/{c.get('compression') or 'none'}",
            "scenario": (c.get("loadgen") or {}).get("scenario") or CLOSED_LOOP,
            **{k: s.get(k) for k in RUN_FIELDS if k in s},
            **{k: v for k, v in s.items() if k.startswith("loadgen_")},
            **{k: v for k, v in s.items() if BREAKDOWN.match(k) or RESOURCES.match(k)},
            "link_mode": rec["manifest"]["link"].get("mode"), "throttled": _throttled(rec.get("sysmon")),
            "error": rec.get("error"),
            "json": name}


def cipher_of(manifest: dict[str, Any]) -> str:
    """The cipher a run's data port used (``none``: plain; records from before encryption say
    nothing): what ``--encrypt auto`` resolved to, not the choice."""
    for stage in manifest.get("stages") or []:
        cipher = stage.get("cipher") if isinstance(stage, dict) else None
        if isinstance(cipher, dict) and isinstance(cipher.get("cipher"), str):
            return cipher["cipher"]
    return PLAIN


def transport_of(manifest: dict[str, Any]) -> str:
    """The transport a run's data port used (``tcp``: raw sockets; records from before transports,
    and RPC runs, say nothing)."""
    for stage in manifest.get("stages") or []:
        used = stage.get("transport") if isinstance(stage, dict) else None
        if isinstance(used, dict) and isinstance(used.get("transport"), str):
            return used["transport"]
    return RAW_TCP


def _throttled(sysmon: Any) -> bool | None:
    """True when any stage saw its CPU throttled during the run (None: nobody could tell)."""
    flags = [v.get("throttled") for v in (sysmon or {}).values() if isinstance(v, dict)]
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _sort_key(key: tuple) -> tuple:
    return tuple((0, x, "") if isinstance(x, (int, np.integer)) else (1, 0, str(x)) for x in key)


def summarize_runs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: median, p95 and a 95% CI of the median over its runs (``records.median_ci``).

    A configuration whose runs were cut short by the user's ``--max-batch-s`` and that has no
    complete run is a row of its own with ``status`` infeasible, the reason and the batches it
    completed: a measured outcome that the report draws as dominated."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    infeasible: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = key_values(row)
        if row["status"] == "complete":
            groups.setdefault(key, []).append(row)
        elif row["status"] == "infeasible":
            infeasible.setdefault(key, []).append(row)
    out = [{**dict(zip(CONFIG_KEY, key)), "cut": members[0]["cut"], "status": "infeasible", "runs": 0,
            "infeasible_runs": len(members), "batches_completed": max(m.get("batches_measured") or 0 for m in members),
            "infeasible_reason": members[-1].get("error")}
           for key, members in infeasible.items() if key not in groups]
    for key, members in sorted(groups.items(), key=lambda kv: _sort_key(kv[0])):
        entry = dict(zip(CONFIG_KEY, key))
        entry["cut"] = members[0]["cut"]
        entry["status"] = "complete"
        entry["runs"] = len(members)
        for metric, stem, unit in (("latency_median_s", "latency_median", "_s"),
                                   ("throughput_imgs_per_s", "throughput", "_imgs_per_s")):
            xs = [m[metric] for m in members if m.get(metric) is not None]
            lo, hi = records.median_ci(xs)
            entry[metric] = float(np.median(xs)) if xs else None
            entry[f"{stem}_p95{unit}"] = float(np.percentile(xs, 95)) if xs else None
            entry[f"{stem}_ci95_low{unit}"] = lo
            entry[f"{stem}_ci95_high{unit}"] = hi
        for metric in ("latency_p95_s", "transfer_median_s", "stage1_compute_median_s", "stage2_compute_median_s",
                       "stage2_queue_median_s", "goodput_mbit_per_s"):
            xs = [m[metric] for m in members if m.get(metric) is not None]
            entry[metric] = float(np.median(xs)) if xs else None
        for metric in ("stage1_compute_median_s", "stage2_compute_median_s"):  # the report's sanity checks
            lo, hi = records.median_ci([m.get(metric) for m in members])
            entry[metric.replace("_median_s", "_ci95_low_s")] = lo
            entry[metric.replace("_median_s", "_ci95_high_s")] = hi
        for metric in ("wire_bytes_mean", "result_wire_bytes_mean"):
            xs = [m[metric] for m in members if m.get(metric) is not None]
            entry[metric] = float(np.mean(xs)) if xs else None
        entry["throttled_runs"] = sum(bool(m.get("throttled")) for m in members)
        for metric in sorted({k for m in members for k in m if BREAKDOWN.match(k)} | {"latency_mean_s"}):
            xs = [m[metric] for m in members if m.get(metric) is not None and m[metric] == m[metric]]
            entry[metric] = float(np.mean(xs)) if xs else None  # a mean of means: still adds up
        pay = [m["payload_bytes_mean"] for m in members if m.get("payload_bytes_mean") is not None]
        entry["payload_bytes_mean"] = float(np.mean(pay)) if pay else None
        entry.update(_resource_entry(members))
        entry.update(_loadgen_entry(members))
        out.append(entry)
    return sorted(out, key=lambda e: _sort_key(tuple(e[k] for k in CONFIG_KEY)))



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
        parts = sorted({k for r in rows for k in r if BREAKDOWN.match(k) or RESOURCES.match(k)})
        records.atomic_write_csv(self.path / "runs.csv", rows, RUN_FIELDS + parts)
        if final:
            summary = summarize_runs(rows)
            for entry in summary:
                entry.update((stopping or {}).get(ConfigKey.of(entry), {}))
            records.atomic_write_csv(self.path / "summary.csv", summary)
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
        runs = _read_csv(self.path / "runs.csv")
        runs["latency_s"] = runs["latency_median_s"]
        return runs

    def configs(self):
        """summary.csv as a DataFrame, with ``latency_s`` = the configuration's median latency."""
        summary = _read_csv(self.path / "summary.csv", fill=("in_flight",))
        if "in_flight" not in summary.columns:
            # A summary from before the in-flight depth was in the key: its runs.csv has each run's.
            runs = _read_csv(self.path / "runs.csv")
            others = [k for k in CONFIG_KEY if k != "in_flight"]
            depth = runs.drop_duplicates(others).set_index(others)["in_flight"]
            summary["in_flight"] = [int(depth.get(tuple(r), 1)) for r in summary[others].itertuples(index=False)]
        summary["latency_s"] = summary["latency_median_s"]
        return summary


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
    for column, default in KEY_DEFAULTS.items():
        if column not in df.columns and column not in fill:
            df[column] = default
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
