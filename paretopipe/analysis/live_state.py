"""A session as it is being written, as one JSON object: what ``paretopipe watch`` serves at
``/api/session`` and its page draws.

Read from the files a sweep writes as it goes (``docs/records.md``): each run's record in
``runs/`` the moment the run ends, ``session.json`` at each group's start and every consolidation.
``configurations`` holds one entry per row of ``summary.csv``: the file's rows once the sweep has
written it after its last run, and until then the same function's rows over the records written so
far (``configurations_source`` says which), each with ``on_front`` for the latency/throughput front
of its network. The newest run gives the batch latencies; the newest run of a runtime policy
(``adaptive``, ``sciot``) its choices, switches and re-profiles over time; ``session.json`` the
progress, the failures and the drift checks. Nothing here writes to the session.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from .. import workload
from ..splitspec import POLICIES
from . import pareto
from .session import Session
from .summarize import summarize_runs

GROUP = ["model", "backend", "cipher", "network", "batch_size", "prompt_len", "placement"]
#: Newest batches of a run the page gets (a long run's first ones are in its record).
MAX_BATCHES = 2000


class LiveSession:
    """One session folder, read again on every :meth:`state` (run records parsed once per change)."""

    def __init__(self, path: str | Path) -> None:
        self.session = Session(path)
        self._records: dict[Path, tuple[int, dict[str, Any]]] = {}

    def state(self) -> dict[str, Any]:
        s = self.session
        meta = s.read_meta() or {}
        rows, _ = s.run_rows()
        configurations, source, axes = self._configurations(rows)
        newest = self._newest_runs()
        return {"session": s.path.name, "path": str(s.path), "served_utc": _utc_now(), "axes": axes,
                "updated_utc": meta.get("updated_utc"), "complete": bool(meta.get("complete")),
                "interrupted": meta.get("interrupted"),
                "progress": progress(meta, len(rows)),
                "configurations": configurations, "configurations_source": source,
                "current_run": _run_view(newest[0]) if newest else None,
                "policy_run": next((_policy_view(r) for r in newest if _is_policy(r)), None),
                "drift": _drift_alerts(meta), "failures": len(meta.get("failures") or [])}

    def _configurations(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
        """The configurations so far, where they come from, and the front's two axes."""
        summary = self.session.path / "summary.csv"
        runs_dir = self.session.runs_dir
        newest = max((p.stat().st_mtime for p in runs_dir.glob("*.json")), default=0.0) if runs_dir.is_dir() else 0.0
        if summary.is_file() and summary.stat().st_mtime >= newest:
            table, source = pd.read_csv(summary).copy(), "summary.csv"  # consolidated: one block per dtype
        elif rows:
            table, source = pd.DataFrame(summarize_runs(rows)), "run records"
        else:
            return [], "run records", axes_of(pd.DataFrame())
        return _records_of(_with_front(table)), source, axes_of(table)

    def _newest_runs(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest run records, newest first (policy runs are looked for among them)."""
        runs_dir = self.session.runs_dir
        if not runs_dir.is_dir():
            return []
        paths = sorted(runs_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
        out = []
        for p in paths:
            rec = self._read(p)
            if rec is not None:
                out.append(rec)
        return out

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            mtime = path.stat().st_mtime_ns
            cached = self._records.get(path)
            if cached is None or cached[0] != mtime:
                self._records[path] = (mtime, json.loads(path.read_text()))
            return self._records[path][1]
        except (OSError, ValueError):  # being replaced this instant, or not a record: skipped this time
            return None


def progress(meta: dict[str, Any], runs_done: int) -> dict[str, Any]:
    """Runs recorded against runs planned (``session.json``'s ``progress``), and the time left at
    the pace so far (``eta_s``: an estimate, None until there is a pace)."""
    planned = (meta.get("progress") or {}).get("planned_runs")
    created = meta.get("created_utc")
    elapsed = None
    if created:
        try:
            elapsed = max(0.0, time.time() - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp())
        except ValueError:
            elapsed = None
    done = runs_done
    eta = None
    if planned and done and elapsed is not None and not meta.get("complete"):
        eta = elapsed / done * max(0, planned - done)
    return {"runs_done": done, "planned_runs": planned, "fraction": (done / planned) if planned else None,
            "elapsed_s": elapsed, "eta_s": 0.0 if meta.get("complete") else eta,
            "planned_estimated": bool((meta.get("progress") or {}).get("estimated"))}


def axes_of(table: pd.DataFrame) -> dict[str, Any]:
    """The live front's axes, as the page draws them: latency (ms) against throughput (images/s),
    or a language model's time to first token against time per token (both ms)."""
    def axis(column: str, low: str, high: str, label: str, scale: float, sense: str) -> dict[str, Any]:
        return {"column": column, "low": low, "high": high, "label": label, "scale": scale, "sense": sense}

    if workload.of_table(table).generates:
        return {"x": axis("ttft_median_s", "ttft_ci95_low_s", "ttft_ci95_high_s", "time to first token (ms)", 1e3,
                          "min"),
                "y": axis("tpot_median_s", "tpot_ci95_low_s", "tpot_ci95_high_s", "time per token (ms)", 1e3, "min")}
    return {"x": axis("latency_median_s", "latency_median_ci95_low_s", "latency_median_ci95_high_s",
                      "latency median (ms)", 1e3, "min"),
            "y": axis("throughput_imgs_per_s", "throughput_ci95_low_imgs_per_s", "throughput_ci95_high_imgs_per_s",
                      "img/s", 1.0, "max")}


def _with_front(table: pd.DataFrame) -> pd.DataFrame:
    axes = axes_of(table)
    if axes["x"]["column"] not in table or table.empty:
        return table.assign(on_front=False)
    by = [c for c in GROUP if c in table.columns]
    marked = pareto.mark_front(table, {a["column"]: a["sense"] for a in axes.values()}, by)
    return table.assign(on_front=marked["on_front"].to_numpy())


def _records_of(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in table.to_dict("records")]


def _clean(value: Any) -> Any:
    """JSON's values: NaN and infinities are null; numpy scalars are numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _is_policy(rec: dict[str, Any]) -> bool:
    return str(rec.get("config", {}).get("split_index")) in POLICIES


def _run_view(rec: dict[str, Any]) -> dict[str, Any]:
    cfg = rec.get("config", {})
    batches = [b for b in rec.get("batches", []) if b.get("latency_s") is not None][-MAX_BATCHES:]
    return {"run_key": cfg.get("run_key"), "split_index": cfg.get("split_index"), "network": cfg.get("network"),
            "status": rec.get("status"), "created_utc": rec.get("created_utc"),
            "start_s": [round(b.get("start_s") or 0.0, 4) for b in batches],
            "latency_ms": [round(b["latency_s"] * 1e3, 3) for b in batches],
            "warmup": [bool(b.get("warmup")) for b in batches]}


def _policy_view(rec: dict[str, Any]) -> dict[str, Any]:
    view = _run_view(rec)
    stage1 = rec.get("manifest", {}).get("stages", [{}])[0]
    a = stage1.get("adaptive", {})
    batches = [b for b in rec.get("batches", []) if b.get("latency_s") is not None][-MAX_BATCHES:]
    start_of = {b.get("seq"): b.get("start_s") for b in batches}
    events = a.get("compute", {}).get("reprofile_events", [])
    view.update(policy=a.get("policy", view["split_index"]), switches=a.get("switches"),
                split_k=[b.get("split_k") for b in batches],
                served_locally=[bool(b.get("served_locally")) for b in batches],
                reprofiles=[{**e, "start_s": start_of.get(e.get("seq"))} for e in events],
                reprofile_count=a.get("compute", {}).get("reprofiles"),
                cpu_share=[{"t_s": s["t_s"], "cpu_share": s["cpu_share"], "stage": r["stage"]}
                           for r in stage1.get("cpu_traces", []) for s in r["steps"]])
    return view


def _drift_alerts(meta: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, group in (meta.get("groups") or {}).items():
        for check in group.get("drift_checks") or []:
            if check.get("drift"):
                out.append({"group": name, **check})
    return out


def _utc_now() -> str:
    return datetime.utcnow().isoformat(timespec="seconds") + "Z"
