"""Each engine's front on one figure per network (``engines_<panel>.png``) and the knee split each
engine reaches on each network (``engines.csv``): where a session measured several engines
(paretopipe.engines), whether the split the suite calls best moves with the engine. A language
model's fronts are its latency per step (a prefill, or one token of each stream) against tokens/s
(our engine beside llama.cpp's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .. import records
from .keys import DEFAULT_ENGINE, PANEL_KEY, panel_names, split_sort_key
from .objectives import resolve, throughput_column
from .plotting import PALETTE, plain_log_ticks, save_figure

ENGINES_FILE = "engines.csv"
#: A panel's settings but its engine: the engines of one setting share a figure.
SETTING = [c for c in PANEL_KEY if c != "engine"]


def knees(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting, network and engine: the knee split, the front's splits, and the knee's
    latency (a generation's: time per output token) and throughput (images or tokens per second),
    from a table of :func:`report.pareto_table`."""
    rows, rate = [], throughput_column(table)
    for key, group in table.groupby([*SETTING, "network", "engine"], dropna=False, sort=False):
        front = group[group["on_front"]]
        knee = group[group["knee"].fillna(False).astype(bool)] if "knee" in group.columns else front.iloc[:0]
        best = knee.iloc[0] if len(knee) else None
        rows.append({**dict(zip([*SETTING, "network", "engine"], key)),
                     "knee_split": best["split_index"] if best is not None else None,
                     "front_splits": " ".join(str(k) for k in sorted(front["split_index"], key=split_sort_key)),
                     "knee_latency_s": best["latency_s"] if best is not None else None,
                     f"knee_{rate}": best[rate] if best is not None else None})
    return pd.DataFrame(rows)


def write(table: pd.DataFrame, out: Path, plt: Any, fmt: str = "png") -> pd.DataFrame:
    """The figures and ``engines.csv`` where the table holds two engines or more; returns the knees,
    empty otherwise."""
    if "engine" not in table.columns or "latency_s" not in table.columns:
        return pd.DataFrame()
    table = table.assign(engine=table["engine"].fillna(DEFAULT_ENGINE))
    if table["engine"].nunique() < 2:
        return pd.DataFrame()
    for key, panel in table.groupby(SETTING, dropna=False, sort=False):
        _figure(plt, panel, key, out, fmt)
    found = knees(table)
    records.atomic_write_csv(out / ENGINES_FILE, found.to_dict("records"), list(found.columns))
    return found


def _figure(plt: Any, panel: pd.DataFrame, key: tuple, out: Path, fmt: str) -> None:
    networks = list(dict.fromkeys(panel["network"]))
    fig, axes = plt.subplots(1, len(networks), figsize=(5 * len(networks), 4.5), squeeze=False)
    title, stem = panel_names((*key, DEFAULT_ENGINE))
    # The workload's own latency (per batch, or per step of a generation) and throughput.
    latency, throughput = resolve("latency", panel), resolve("throughput", panel)
    rate = throughput.column
    for ax, network in zip(axes[0], networks):
        for i, (engine, rows) in enumerate(panel[panel["network"] == network].groupby("engine", sort=True)):
            colour = PALETTE[i % len(PALETTE)]
            ax.scatter(rows[latency.column] * 1e3, rows[rate], color=colour, alpha=0.3, s=18)
            front = rows[rows["on_front"]].sort_values(latency.column)
            ax.plot(front[latency.column] * 1e3, front[rate], "-o", color=colour, ms=5, label=f"{engine} front")
            for _, row in front.iterrows():
                knee = bool(row.get("knee", False))
                ax.annotate(f"k={row['split_index']}" + (" (knee)" if knee else ""),
                            (row[latency.column] * 1e3, row[rate]), fontsize=7, color=colour,
                            fontweight="bold" if knee else "normal", xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_title(network)
        ax.set_xlabel(latency.label.replace("(s)", "(ms, log scale)"))
        ax.set_ylabel(throughput.label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Each engine's front: {title}")
    save_figure(fig, out / f"engines_{stem}.{fmt}")
