"""Static splits against the adaptive one under the same stretch of a trace: the table, the goal,
and the latency-over-time figure with the adaptive choice drawn over the trace's capacity.

Every configuration of a sweep run r replays its trace from the same seeded offset (the run index
is the seed), so static and adaptive runs meet the same segment. The best static split is chosen
in hindsight: the lowest median latency among the two-stage static splits measured, block splits
and cuts of several tensors alike (the adaptive split may choose either).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..network import traces
from ..splits import ADAPTIVE
from .session import Session, split_sort_key
from .. import records
from .plotting import save_figure

GOAL_WITHIN = 0.10   # adaptive's median latency within 10% of the best static split's
COLUMNS = ["model", "backend", "network", "batch_size", "split_index", "role", "latency_median_s",
           "latency_p95_s", "throughput_imgs_per_s", "runs"]
KEY = ["model", "backend", "network", "batch_size"]


def comparison(configs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every split's row with its role, one verdict row per group that has an adaptive run)."""
    rows, verdicts = [], []
    for key, grp in configs.groupby(KEY, sort=False):
        labels = grp["split_index"].astype(str)
        if ADAPTIVE not in set(labels):
            continue
        static = grp[(labels != ADAPTIVE) & ~labels.str.contains(",")]   # two-stage: not a plan
        adaptive = grp[labels == ADAPTIVE].iloc[0]
        if static.empty or pd.isna(adaptive["latency_median_s"]):
            continue
        best = static.loc[static["latency_median_s"].idxmin()]
        for _, r in grp.iterrows():
            role = ("adaptive" if str(r["split_index"]) == ADAPTIVE else
                    "best static" if r["split_index"] == best["split_index"] else "static")
            rows.append({**{c: r.get(c) for c in COLUMNS if c != "role"}, "role": role})
        ratio = adaptive["latency_median_s"] / best["latency_median_s"]
        verdicts.append({**dict(zip(KEY, key)), "best_static_split": best["split_index"],
                         "best_static_latency_median_s": best["latency_median_s"],
                         "adaptive_latency_median_s": adaptive["latency_median_s"],
                         "adaptive_over_best_latency": ratio,
                         "best_static_latency_p95_s": best.get("latency_p95_s"),
                         "adaptive_latency_p95_s": adaptive.get("latency_p95_s"),
                         "best_static_throughput_imgs_per_s": best["throughput_imgs_per_s"],
                         "adaptive_throughput_imgs_per_s": adaptive["throughput_imgs_per_s"],
                         "within_goal": bool(ratio <= 1 + GOAL_WITHIN), "beats_best_static": bool(ratio < 1)})
    return pd.DataFrame(rows, columns=COLUMNS), pd.DataFrame(verdicts)


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
    rate = [trace.rate_bps(meta["offset_s"] + a, meta["offset_s"] + a + step_s) / 1e6 for a in t]
    return t, np.asarray(rate)


def plot_over_time(session: Session, runs: pd.DataFrame, verdict: dict[str, Any], fig, title: str) -> None:
    """Top: latency per batch over time (adaptive, the best static split, all-local K). Bottom: the
    trace's capacity with the adaptive split drawn over it."""
    network = verdict["network"]
    adaptive = _record(session, runs, network, ADAPTIVE)
    if adaptive is None:
        return
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    blocks = [int(k) for k in runs["split_index"].astype(str) if k.lstrip("-").isdigit()]
    local = {str(max(blocks))} if blocks else set()   # all on stage 1, k = K
    statics = sorted({str(verdict["best_static_split"])} | local, key=split_sort_key)
    for label, rec in [("adaptive", adaptive)] + [(f"static {'k=' if k.isdigit() else ''}{k}",
                                                   _record(session, runs, network, k)) for k in statics]:
        if rec is None:
            continue
        pts = [(b["start_s"], b["latency_s"] * 1e3) for b in rec["batches"] if b.get("latency_s") is not None]
        if pts:
            xs, ys = zip(*pts)
            top.plot(xs, ys, ".-" if label == "adaptive" else ".", ms=3, lw=0.6, label=label, alpha=0.85)
    top.set_ylabel("latency per batch (ms)")
    top.set_yscale("log")
    top.legend(fontsize=7)
    top.set_title(title)
    batches = [b for b in adaptive["batches"] if b.get("latency_s") is not None]
    until = max((b["start_s"] for b in batches), default=1.0)
    cap = capacity_over_time(adaptive, until)
    if cap is not None:
        bottom.fill_between(cap[0], cap[1], step="post", alpha=0.3, color="tab:gray", label="trace capacity")
        bottom.set_ylabel("capacity (Mbit/s)")
    twin = bottom.twinx()
    # A cut of several tensors has no block index: a gap in the line (its batches carry split_candidate).
    k_of = [math.nan if b.get("split_k") is None else b["split_k"] for b in batches]
    twin.step([b["start_s"] for b in batches], k_of, where="post", color="tab:red", lw=1, label="adaptive split k")
    local = [(b["start_s"], k) for b, k in zip(batches, k_of) if b.get("served_locally")]
    if local:
        twin.plot([t for t, _ in local], [k for _, k in local], "kx", ms=4, label="served locally")
    twin.set_ylabel("adaptive split k", color="tab:red")
    bottom.set_xlabel("time since the link started (s)")
    handles = bottom.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    bottom.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper right")


def format_verdicts(verdicts: pd.DataFrame) -> str:
    """The closing lines: one per trace, with the goal."""
    lines = []
    for _, v in verdicts.iterrows():
        lines.append(f"{v['model']} {v['network']}: adaptive median {v['adaptive_latency_median_s'] * 1e3:.1f} ms "
                     f"vs best static k={v['best_static_split']} {v['best_static_latency_median_s'] * 1e3:.1f} ms "
                     f"({v['adaptive_over_best_latency']:.2f}x; p95 {v['adaptive_latency_p95_s'] * 1e3:.0f} vs "
                     f"{v['best_static_latency_p95_s'] * 1e3:.0f} ms; throughput "
                     f"{v['adaptive_throughput_imgs_per_s']:.2f} vs {v['best_static_throughput_imgs_per_s']:.2f} img/s)"
                     f" - within {GOAL_WITHIN:.0%}: {'yes' if v['within_goal'] else 'NO'}, beats it: "
                     f"{'yes' if v['beats_best_static'] else 'no'}")
    return "\n".join(lines)


def write(session: Session, out: Path, fmt: str, plt) -> pd.DataFrame | None:
    """adaptive.csv, adaptive_verdicts.csv and one latency-over-time figure per trace; None when the
    session has no adaptive runs."""
    configs = session.configs()
    if configs is None or ADAPTIVE not in set(configs["split_index"].astype(str)):
        return None
    table, verdicts = comparison(configs)
    records.atomic_write_csv(out / "adaptive.csv", table.to_dict("records"), list(table.columns))
    records.atomic_write_csv(out / "adaptive_verdicts.csv", verdicts.to_dict("records"), list(verdicts.columns))
    runs = session.runs()
    for _, v in verdicts.iterrows():
        fig = plt.figure(figsize=(10, 6))
        plot_over_time(session, runs, v.to_dict(), fig,
                       f"{v['model']} under {v['network']}: adaptive vs static splits (run 0)")
        fig.tight_layout()
        save_figure(fig, out / f"adaptive_{records.file_label(str(v['model']) + '_' + str(v['network']))}.{fmt}")
    return verdicts
