"""summary.csv's maths: one row per configuration from its runs' rows, each figure's median over
the runs, and a 95% CI of the median for the figures fronts are drawn over."""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from .. import records, workload
from .columns import BREAKDOWN, FAULT, FIDELITY, GENERATION, GENERATION_OBJECTIVES, RESOURCE_OBJECTIVE, RESOURCES
from .keys import CONFIG_KEY, key_values

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
        if metric.endswith(("over_memory_limit", "memory_fits", "energy_below_idle")):  # one run over the limit is over
            flags = [str(v).lower() in ("true", "1") for v in values]
            entry[metric] = (all(flags) if metric.endswith("memory_fits") else any(flags)) if flags else None
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


def _median_entry(members: Sequence[dict[str, Any]], columns: re.Pattern) -> dict[str, Any]:
    """summary.csv's fidelity (or fault) columns of one configuration: each figure's median over
    its runs (fidelity's agree: the pass is deterministic), and the last run's error where the
    fidelity pass failed."""
    entry: dict[str, Any] = {}
    for metric in sorted({k for m in members for k in m if columns.match(k)}):
        values = [m[metric] for m in members if m.get(metric) is not None and m[metric] == m[metric] and m[metric] != ""]
        if metric == "fidelity_error":
            entry[metric] = values[-1] if values else None
        else:
            entry[metric] = float(np.median([float(v) for v in values])) if values else None
    return entry


def _generation_entry(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary.csv's generation columns of one configuration (none for image batches): each
    figure's median over its runs; time to first token, time per token and tokens/s with a 95% CI."""
    entry: dict[str, Any] = {}
    for metric in sorted({k for m in members for k in m if GENERATION.match(k)} - {"prompt_len"}):
        xs = [float(m[metric]) for m in members if m.get(metric) is not None and m[metric] == m[metric]]
        entry[metric] = float(np.median(xs)) if xs else None
        if metric in GENERATION_OBJECTIVES:
            stem, unit = GENERATION_OBJECTIVES[metric]
            entry[f"{stem}_ci95_low{unit}"], entry[f"{stem}_ci95_high{unit}"] = records.median_ci(xs)
    return entry


def _sort_key(key: tuple) -> tuple:
    return tuple((0, x, "") if isinstance(x, (int, np.integer)) else (1, 0, str(x)) for x in key)


def _workload(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's workload, as its runs said (absent from a table that predates it)."""
    name = members[0].get(workload.FIELD)
    return {workload.FIELD: name} if isinstance(name, str) else {}


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
    out = [{**dict(zip(CONFIG_KEY, key)), **_workload(members), "cut": members[0]["cut"], "status": "infeasible", "runs": 0,
            "infeasible_runs": len(members), "batches_completed": max(m.get("batches_measured") or 0 for m in members),
            "infeasible_reason": members[-1].get("error")}
           for key, members in infeasible.items() if key not in groups]
    for key, members in sorted(groups.items(), key=lambda kv: _sort_key(kv[0])):
        entry = {**dict(zip(CONFIG_KEY, key)), **_workload(members)}
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
        entry.update(_generation_entry(members))
        entry.update(_median_entry(members, FIDELITY))
        entry.update(_median_entry(members, FAULT))
        out.append(entry)
    return sorted(out, key=lambda e: _sort_key(key_values(e)))
