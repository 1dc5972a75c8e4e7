"""Static splits against the runtime policies (ours, ``adaptive``, and SCIoT's rule, ``sciot``)
under the same stretch of a trace, link or compute: the table, the goal, how many batches each
policy took to react to each change, and the latency-over-time figure with the choices drawn over
the trace.

Every configuration of a sweep run r replays its trace from the same seeded offset (the run index
is the seed), so static and adaptive runs meet the same segment. The best static split is chosen
in hindsight: the lowest median latency among the two-stage static splits measured, block splits
and cuts of several tensors alike (the adaptive split may choose either).

Which median: a run is a fixed number of batches, and a closed loop runs more of them where it is
fast, so a median over batches counts each phase of a trace by how many batches a split fits into
it, not by how long the phase lasts. A static split that is fast in the long phase and three
times slower in the short one then shows the fast phase's latency only, while a policy that is
quicker in the slow phase puts more of its batches there and shows a higher median for being
better. So where the records are at hand the comparison is by the *time-weighted median over the
common span*: the latency of the batch in flight at an instant drawn uniformly from the span of
trace time every configuration of the run covered (each batch weighted by the part of its
duration inside the span), the median over runs. ``compared_by`` names the statistic; the medians
over batches stay in their own columns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..network import traces
from ..splitspec import ADAPTIVE, POLICIES
from .session import Session
from .keys import split_sort_key
from .. import records
from .plotting import plain_log_ticks, save_figure

GOAL_WITHIN = 0.10   # adaptive's median latency within 10% of the best static split's
COLUMNS = ["model", "backend", "network", "batch_size", "split_index", "role", "latency_median_s",
           "latency_p95_s", "throughput_imgs_per_s", "runs"]
KEY = ["model", "backend", "network", "batch_size"]


SPAN = "time-weighted median over the common span"
BATCHES = "median over batches"


def comparison(configs: pd.DataFrame, reactions: dict[tuple, dict[str, float | None]] | None = None,
               spans: dict[tuple, dict[str, float]] | None = None,
               starts: dict[tuple, dict[str, str]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every split's row with its role, one verdict row per group that has a policy's run). The
    verdict carries, per policy present (``adaptive``, ``sciot``), its medians, its ratio to the
    best static split, the goal, and (``reactions``: group key + policy -> median batches) how
    fast it reacted. With ``spans`` (group key -> split label -> time-weighted median over the
    common span, :func:`span_medians`) covering every split of a group, the best static split and
    the ratios are by that statistic; otherwise by the median over batches. With ``starts`` (group
    key -> policy -> the split of its first measured batch, :func:`start_splits`), each policy is
    also set against the static split it started with, where that split was measured."""
    rows, verdicts = [], []
    for key, grp in configs.groupby(KEY, sort=False):
        grp = grp.copy()
        labels = grp["split_index"].astype(str)
        present = [p for p in POLICIES if p in set(labels)]
        static = grp[~labels.isin(POLICIES) & ~labels.str.contains(",")]   # two-stage: not a plan
        if not present or static.empty:
            continue
        span = (spans or {}).get(key, {})
        by_span = all(label in span for label in labels)
        grp["latency_span_median_s"] = [span.get(label, math.nan) for label in labels]
        stat = "latency_span_median_s" if by_span else "latency_median_s"
        static = grp.loc[static.index]
        best = static.loc[static[stat].idxmin()]
        for _, r in grp.iterrows():
            label = str(r["split_index"])
            role = label if label in POLICIES else "best static" if r["split_index"] == best["split_index"] else "static"
            rows.append({**{c: r.get(c) for c in COLUMNS if c != "role"}, "role": role,
                         "latency_span_median_s": r["latency_span_median_s"]})
        verdict: dict[str, Any] = {**dict(zip(KEY, key)), "compared_by": SPAN if by_span else BATCHES,
                                   "best_static_split": best["split_index"],
                                   "best_static_latency_median_s": best["latency_median_s"],
                                   "best_static_latency_span_median_s": best["latency_span_median_s"],
                                   "best_static_latency_p95_s": best.get("latency_p95_s"),
                                   "best_static_throughput_imgs_per_s": best["throughput_imgs_per_s"]}
        for policy in POLICIES:
            row = grp[labels == policy].iloc[0] if policy in present else None
            ratio = row[stat] / best[stat] if row is not None else math.nan
            verdict.update({f"{policy}_latency_median_s": row["latency_median_s"] if row is not None else math.nan,
                            f"{policy}_latency_span_median_s": row["latency_span_median_s"] if row is not None
                            else math.nan,
                            f"{policy}_over_best_latency": ratio,
                            f"{policy}_latency_p95_s": row.get("latency_p95_s") if row is not None else math.nan,
                            f"{policy}_throughput_imgs_per_s": row["throughput_imgs_per_s"] if row is not None
                            else math.nan,
                            f"{policy}_reaction_batches_median": (reactions or {}).get(key, {}).get(policy)})
            start = (starts or {}).get(key, {}).get(policy)
            first = static[static["split_index"].astype(str) == start] if start is not None else static.iloc[:0]
            verdict.update({f"{policy}_started_at": start,
                            f"{policy}_over_start_latency": row[stat] / first.iloc[0][stat]
                            if row is not None and not first.empty else math.nan})
            if policy == ADAPTIVE:  # the adaptive goal keeps its columns' names
                verdict.update(within_goal=bool(ratio <= 1 + GOAL_WITHIN), beats_best_static=bool(ratio < 1))
            else:
                verdict.update({f"{policy}_within_goal": bool(ratio <= 1 + GOAL_WITHIN),
                                f"{policy}_beats_best_static": bool(ratio < 1)})
        verdicts.append(verdict)
    return pd.DataFrame(rows, columns=COLUMNS + ["latency_span_median_s"]), pd.DataFrame(verdicts)


def time_weighted_median(batches: list[dict], until_s: float) -> float | None:
    """The latency of the batch in flight at an instant drawn uniformly from [0, ``until_s``] of
    the batch clock: each measured batch weighted by the part of its duration inside the span
    (warm-up batches hold their time but are not measured)."""
    pairs = [(b["latency_s"], min(b["end_s"], until_s) - b["start_s"]) for b in batches
             if not b.get("warmup") and b.get("latency_s") is not None and b.get("start_s") is not None
             and b.get("end_s") is not None and b["start_s"] < until_s]
    pairs = sorted((lat, w) for lat, w in pairs if w > 0)
    if not pairs:
        return None
    lat, w = np.array(pairs).T
    return float(lat[np.searchsorted(np.cumsum(w), 0.5 * w.sum())])


def span_medians(session: Session, runs: pd.DataFrame) -> dict[tuple, dict[str, float]]:
    """Per group and split label, the median over runs of :func:`time_weighted_median` over the
    span every configuration of that run covered (the earliest last batch end among them)."""
    done = runs[runs["status"] == "complete"]
    out: dict[tuple, dict[str, list[float]]] = {}
    for key, grp in done.groupby(KEY + ["run"], sort=False):
        recs = {}
        for _, r in grp.iterrows():
            path = session.path / str(r["json"])
            if path.exists():
                recs[str(r["split_index"])] = [b for b in json.loads(path.read_text())["batches"]
                                               if b.get("end_s") is not None]
        ends = [max(b["end_s"] for b in bs) for bs in recs.values() if bs]
        if len(ends) < len(recs) or not ends:
            continue
        slot = out.setdefault(tuple(key[:-1]), {})
        for label, bs in recs.items():
            value = time_weighted_median(bs, min(ends))
            if value is not None:
                slot.setdefault(label, []).append(value)
    return {key: {label: float(np.median(v)) for label, v in slot.items()} for key, slot in out.items()}


def change_times(record: dict) -> list[float]:
    """When, on the run's batch clock, a trace changed what the stages had: each compute-trace
    step the controller made, and each rate change of a CSV link trace (a Mahimahi trace changes
    with every packet: none are taken from it)."""
    out = [s["t_s"] for replay in _stage1(record).get("cpu_traces", [])
           for s in replay["steps"] if s["t_s"] > 0]
    meta = record["manifest"].get("link", {}).get("trace_up")
    if meta and str(meta.get("trace", "")).endswith(".csv"):
        try:
            rows = [ln.split(",") for ln in Path(meta["trace"]).read_text().splitlines()
                    if ln.strip() and not ln.startswith("#") and ln[0].isdigit()]
        except OSError:
            rows = []
        if len(rows) > 1:
            times = [float(r[0]) for r in rows]
            period = times[-1] + (times[-1] - times[-2])
            until = max((b["start_s"] for b in record["batches"]), default=0.0)
            offset = trace_time_at_clock_zero(meta)
            for n in range(int((offset + until) // period) + 1):
                out += [n * period + t - offset for t in times if 0 < n * period + t - offset <= until]
    return sorted(out)


def trace_time_at_clock_zero(trace_meta: dict) -> float:
    """The link trace's time at the batch clock's zero (a record from before ``at_clock_zero_s``
    has the replay's start only, which is early by the run's startup probes)."""
    return float(trace_meta.get("at_clock_zero_s", trace_meta.get("offset_s")) or 0.0)


def _stage1(record: dict) -> dict:
    """Stage 1's manifest (empty for a record without one)."""
    return (record.get("manifest", {}).get("stages") or [{}])[0]


def reaction_batches(record: dict) -> list[int]:
    """For each change (:func:`change_times`) that the policy answered with a switch before the
    next change: how many batches it ran after the change until that switch."""
    batches = [b for b in record["batches"] if not b.get("warmup") and b.get("start_s") is not None]
    changes = change_times(record)
    out = []
    for c, nxt in zip(changes, changes[1:] + [math.inf]):
        after = [b for b in batches if c <= b["start_s"] < nxt]
        first = next((i for i, b in enumerate(after) if b.get("switched")), None)
        if first is not None:
            out.append(first + 1)
    return out


def reactions_of(session: Session, runs: pd.DataFrame) -> dict[tuple, dict[str, float | None]]:
    """Median reaction (batches) of each policy in each group, over its runs."""
    out: dict[tuple, dict[str, float | None]] = {}
    for _, r in runs[runs["split_index"].astype(str).isin(POLICIES) & (runs["status"] == "complete")].iterrows():
        path = session.path / str(r["json"])
        if not path.exists():
            continue
        rec = json.loads(path.read_text())
        counts = reaction_batches(rec)
        key = tuple(r.get(k) for k in KEY)
        slot = out.setdefault(key, {})
        slot.setdefault(f"_{r['split_index']}", []).extend(counts)
    return {key: {p: (float(np.median(slot[f"_{p}"])) if slot.get(f"_{p}") else None) for p in POLICIES}
            for key, slot in out.items()}


def start_split(record: dict) -> str | None:
    """The split label of a policy run's first measured batch (a cut of several tensors by name)."""
    first = next((b for b in record["batches"] if not b.get("warmup") and b.get("latency_s") is not None), None)
    if first is None:
        return None
    if first.get("split_k") is not None:
        return str(first["split_k"])
    candidates = record.get("config", {}).get("adaptive_split", {}).get("candidates") or []
    i = first.get("split_candidate")
    return str(candidates[i]) if isinstance(i, int) and 0 <= i < len(candidates) else None


def start_splits(session: Session, runs: pd.DataFrame) -> dict[tuple, dict[str, str]]:
    """Per group, each policy's :func:`start_split` in its lowest-numbered complete run."""
    out: dict[tuple, dict[str, str]] = {}
    done = runs[runs["split_index"].astype(str).isin(POLICIES) & (runs["status"] == "complete")]
    for _, r in done.sort_values("run", ascending=False).iterrows():
        path = session.path / str(r["json"])
        if path.exists() and (start := start_split(json.loads(path.read_text()))) is not None:
            out.setdefault(tuple(r.get(k) for k in KEY), {})[str(r["split_index"])] = start
    return out


def _record(session: Session, runs: pd.DataFrame, network: str, split: Any, run: int = 0) -> dict | None:
    sel = runs[(runs["network"] == network) & (runs["split_index"].astype(str) == str(split))
               & (runs["status"] == "complete")]
    if sel.empty:
        return None
    pick = sel[sel["run"] == run] if (sel["run"] == run).any() else sel
    path = session.path / str(pick.iloc[0]["json"])
    return json.loads(path.read_text()) if path.exists() else None


def capacity_over_time(record: dict, until_s: float, step_s: float = 0.1) -> tuple[np.ndarray, np.ndarray] | None:
    """The up direction's trace capacity (Mbit/s per ``step_s``) over the run's time axis."""
    meta = record["manifest"]["link"].get("trace_up")
    if not meta:
        return None
    try:
        trace = traces.load(meta["trace"])
    except Exception:  # the trace file is on the host that ran the sweep, not necessarily here
        return None
    t = np.arange(0.0, max(until_s, step_s), step_s)
    zero = trace_time_at_clock_zero(meta)
    rate = [trace.rate_bps(zero + a, zero + a + step_s) / 1e6 for a in t]
    return t, np.asarray(rate)


def plot_over_time(session: Session, runs: pd.DataFrame, verdict: dict[str, Any], fig, title: str) -> None:
    """Top: latency per batch over time (adaptive, the best static split, all-local K). Bottom: the
    trace's capacity with the adaptive split drawn over it."""
    network = verdict["network"]
    policies = [(p, rec) for p in POLICIES if (rec := _record(session, runs, network, p)) is not None]
    if not policies:
        return
    adaptive = policies[0][1]
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    blocks = [int(k) for k in runs["split_index"].astype(str) if k.lstrip("-").isdigit()]
    local = {str(max(blocks))} if blocks else set()   # all on stage 1, k = K
    statics = sorted({str(verdict["best_static_split"])} | local, key=split_sort_key)
    for label, rec in policies + [(f"static {'k=' if k.isdigit() else ''}{k}",
                                   _record(session, runs, network, k)) for k in statics]:
        if rec is None:
            continue
        pts = [(b["start_s"], b["latency_s"] * 1e3) for b in rec["batches"] if b.get("latency_s") is not None]
        if pts:
            xs, ys = zip(*pts)
            top.plot(xs, ys, ".-" if label in POLICIES else ".", ms=3, lw=0.6, label=label, alpha=0.85)
    top.set_ylabel("latency per batch (ms)")
    top.set_yscale("log")
    plain_log_ticks(top.yaxis)
    top.legend(fontsize=7)
    top.set_title(title)
    batches = [b for b in adaptive["batches"] if b.get("latency_s") is not None]
    until = max((b["start_s"] for b in batches), default=1.0)
    cap = capacity_over_time(adaptive, until)
    if cap is not None:
        bottom.fill_between(cap[0], cap[1], step="post", alpha=0.3, color="tab:gray", label="trace capacity")
        bottom.set_ylabel("capacity (Mbit/s)")
    share = share_over_time(adaptive)
    if share is not None:
        bottom.step(share[0], share[1], where="post", color="tab:green", lw=1.2, label="stage-1 CPU share")
        if cap is None:
            bottom.set_ylabel("CPU share (cores)")
    twin = bottom.twinx()
    for (label, rec), color in zip(policies, ("tab:red", "tab:purple")):
        done = [b for b in rec["batches"] if b.get("latency_s") is not None]
        # A cut of several tensors has no block index: a gap in the line (its batches carry split_candidate).
        k_of = [math.nan if b.get("split_k") is None else b["split_k"] for b in done]
        twin.step([b["start_s"] for b in done], k_of, where="post", color=color, lw=1, label=f"{label} split k")
        local = [(b["start_s"], k) for b, k in zip(done, k_of) if b.get("served_locally")]
        if local:
            twin.plot([t for t, _ in local], [k for _, k in local], "kx", ms=4, label=f"{label}: served locally")
        events = _stage1(rec).get("adaptive", {}).get("compute", {}).get("reprofile_events", [])
        starts = {b.get("seq"): b["start_s"] for b in done}
        marks = sorted({starts[e["seq"]] for e in events if e["seq"] in starts})
        if marks:
            twin.plot(marks, [0] * len(marks), "|", color=color, ms=6, alpha=0.5, label=f"{label}: re-profiles")
    twin.set_ylabel("split k", color="tab:red")
    bottom.set_xlabel("time since the link started (s)")
    handles = bottom.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    bottom.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper right")


def share_over_time(record: dict) -> tuple[list[float], list[float]] | None:
    """Stage 1's CPU share as its compute trace's controller set it, on the batches' clock."""
    replays = [r for r in _stage1(record).get("cpu_traces", []) if r["stage"] == "stage1"]
    if not replays or not replays[0]["steps"]:
        return None
    steps = replays[0]["steps"]
    until = max((b["start_s"] for b in record["batches"] if b.get("start_s") is not None), default=0.0)
    return [s["t_s"] for s in steps] + [until], [s["cpu_share"] for s in steps] + [steps[-1]["cpu_share"]]


def format_verdicts(verdicts: pd.DataFrame) -> str:
    """The closing lines: one per trace and policy, with the goal, by the statistic compared."""
    lines = []
    for _, v in verdicts.iterrows():
        span = v.get("compared_by") == SPAN
        stat, name = ("latency_span_median_s", "time-weighted median") if span else ("latency_median_s", "median")
        for policy in POLICIES[::-1]:
            if pd.isna(v.get(f"{policy}_{stat}", math.nan)):
                continue
            within, beats = ("within_goal", "beats_best_static") if policy == ADAPTIVE else \
                (f"{policy}_within_goal", f"{policy}_beats_best_static")
            extra = ""
            if policy == ADAPTIVE:
                extra = (f"; p95 {v['adaptive_latency_p95_s'] * 1e3:.0f} vs {v['best_static_latency_p95_s'] * 1e3:.0f} "
                         f"ms; throughput {v['adaptive_throughput_imgs_per_s']:.2f} vs "
                         f"{v['best_static_throughput_imgs_per_s']:.2f} img/s")
            if not pd.isna(v.get(f"{policy}_over_start_latency", math.nan)):
                extra += f"; {v[f'{policy}_over_start_latency']:.2f}x its start k={v[f'{policy}_started_at']}"
            if span:
                extra += (f"; median over batches {v[f'{policy}_latency_median_s'] * 1e3:.1f} vs "
                          f"{v['best_static_latency_median_s'] * 1e3:.1f} ms")
            lines.append(f"{v['model']} {v['network']}: {policy} {name} {v[f'{policy}_{stat}'] * 1e3:.1f} ms vs best "
                         f"static k={v['best_static_split']} {v[f'best_static_{stat}'] * 1e3:.1f} ms "
                         f"({v[f'{policy}_over_best_latency']:.2f}x{extra}) - within {GOAL_WITHIN:.0%}: "
                         f"{'yes' if v[within] else 'NO'}, beats it: {'yes' if v[beats] else 'no'}")
    return "\n".join(lines)


def write(session: Session, out: Path, fmt: str, plt) -> pd.DataFrame | None:
    """adaptive.csv, adaptive_verdicts.csv and one latency-over-time figure per trace; None when the
    session has no adaptive runs."""
    configs = session.configs()
    if configs is None or not set(POLICIES) & set(configs["split_index"].astype(str)):
        return None
    runs = session.runs()
    table, verdicts = comparison(configs, reactions_of(session, runs), span_medians(session, runs),
                                 start_splits(session, runs))
    records.atomic_write_csv(out / "adaptive.csv", table.to_dict("records"), list(table.columns))
    records.atomic_write_csv(out / "adaptive_verdicts.csv", verdicts.to_dict("records"), list(verdicts.columns))
    for _, v in verdicts.iterrows():
        fig = plt.figure(figsize=(10, 6))
        plot_over_time(session, runs, v.to_dict(), fig,
                       f"{v['model']} under {v['network']}: the policies vs static splits (run 0)")
        fig.tight_layout()
        save_figure(fig, out / f"adaptive_{records.file_label(str(v['model']) + '_' + str(v['network']))}.{fmt}")
    return verdicts
