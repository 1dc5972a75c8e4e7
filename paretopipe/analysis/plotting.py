"""Figures of a session: Pareto fronts, where the time goes per split, latency and throughput
versus split, payload per split. Every figure is written atomically on the file-only Agg backend."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from .. import workload
from .keys import split_sort_key
from .objectives import LATENCY, THROUGHPUT, main_pair

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def front_plot_data(table: pd.DataFrame, x: str = "latency_s", y: str = "throughput_imgs_per_s") -> list[dict[str, Any]]:
    """What a front figure draws, point by point (``x`` and ``y``: the columns of its axes): tests
    check every label names its point."""
    out = []
    for _, row in table.iterrows():
        out.append({"network": row["network"], "x": float(row[x]), "y": float(row[y]),
                    "label": f"k={row['split_index']}", "split_index": row["split_index"],
                    "on_front": bool(row["on_front"]), "knee": bool(row.get("knee", False)),
                    "status": row.get("front_status") or ("front" if row["on_front"] else "dominated")})
    return out


def front_line(points: list[dict[str, Any]], network: str) -> list[tuple[float, float]]:
    """The front of one network as a polyline in the order of its x axis."""
    pts = sorted((p["x"], p["y"]) for p in points if p["network"] == network and p["on_front"])
    return pts


def _axis(column: str, label: str) -> tuple[float, str]:
    """How an objective is drawn: seconds in ms (its label says so), anything else as it is."""
    if column.endswith("_s") and "(s)" in label:
        return 1e3, label.replace("(s)", "(ms)")
    return 1.0, label


def _by_split(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in split order (block index, then plans, then adaptive), whatever the column's dtype."""
    return frame.iloc[sorted(range(len(frame)), key=lambda i: split_sort_key(frame["split_index"].iloc[i]))]


def _colours(networks: Sequence[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(networks)}


def _error_bars(frame: pd.DataFrame, value: str, low: str, high: str, scale: float = 1.0) -> np.ndarray | None:
    """Asymmetric error bars (2 x n) from CI columns; None when the table has none."""
    if low not in frame.columns or high not in frame.columns:
        return None
    v = frame[value].to_numpy(dtype=float) * scale
    lo = frame[low].to_numpy(dtype=float) * scale
    hi = frame[high].to_numpy(dtype=float) * scale
    return np.nan_to_num(np.vstack([np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)]))


def front_axes(table: pd.DataFrame) -> tuple[Any, Any]:
    """The two objectives a table's fronts are drawn on: latency and throughput, or a language
    model's time to first token and time per token."""
    return main_pair(table)


def plot_fronts(table: pd.DataFrame, ax, title: str, line: bool = True, x: Any = None, y: Any = None
                ) -> list[dict[str, Any]]:
    """Every configuration with its 95% CIs on both objectives (``x`` and ``y``; by default the
    table's :func:`front_axes`), each network's front as a line (markers only with ``line`` False:
    a front over other objectives, drawn on these two axes), and the front points' labels placed
    by adjustText so that none collides with another or with a point."""
    from adjustText import adjust_text

    x, y = x or front_axes(table)[0], y or front_axes(table)[1]
    (xs, xlabel), (ys, ylabel) = _axis(x.column, x.label), _axis(y.column, y.label)
    points = front_plot_data(table, x.column, y.column)
    colours = _colours(list(dict.fromkeys(table["network"])))
    texts = []
    for network, colour in colours.items():
        rows = table[table["network"] == network]
        xerr = _error_bars(rows, x.column, x.low or "", x.high or "", xs)
        yerr = _error_bars(rows, y.column, y.low or "", y.high or "", ys)
        if xerr is not None and yerr is not None:
            ax.errorbar(rows[x.column].to_numpy(dtype=float) * xs, rows[y.column].to_numpy(dtype=float) * ys,
                        xerr=xerr, yerr=yerr, fmt="none", ecolor=colour, alpha=0.35, lw=0.8, capsize=1.5)
        mine = [p for p in points if p["network"] == network]
        dominated = [p for p in mine if p["status"] == "dominated"]
        tied = [p for p in mine if p["status"] == "tied"]
        ax.scatter([p["x"] * xs for p in dominated], [p["y"] * ys for p in dominated], color=colour, alpha=0.35, s=22)
        # Tied: dominated, but within the CIs of a front point on both objectives.
        ax.scatter([p["x"] * xs for p in tied], [p["y"] * ys for p in tied], facecolors="none", edgecolors=colour,
                   s=46, lw=1.4, label=f"{network} tied with the front" if tied else None)
        front = front_line(points, network)
        ax.plot([a * xs for a, _ in front], [b * ys for _, b in front], "-o" if line else "o", color=colour, ms=6,
                lw=1.8, label=f"{network} front")
        # Only front points are labelled: a sweep's dominated and tied points crowd together, and no
        # placement keeps 60 labels apart there (report.html names every point on hover).
        for p in mine:
            if p["status"] == "front":
                texts.append(ax.text(p["x"] * xs, p["y"] * ys, p["label"] + (" (knee)" if p["knee"] else ""),
                                     fontsize=7, color=colour, fontweight="bold"))
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    if x is LATENCY and y is THROUGHPUT:  # the suite's own front, as it has always been labelled
        xlabel = "end-to-end latency per batch, median with 95% CI (ms, log scale)"
        ylabel = "throughput (images/s), with 95% CI"
    else:
        xlabel, ylabel = f"{xlabel}, 95% CI, log scale", f"{ylabel}, 95% CI"
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if texts:
        adjust_text(texts, ax=ax, arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.5})
    return points


#: The breakdown's stack, bottom to top: (label, colour, column pattern). Per-batch means, which
#: add up to the mean latency exactly (transfer is latency minus every measured part).
BREAKDOWN_PARTS = (
    ("stage 1 compute", PALETTE[0], r"^stage1_compute_mean_s$"),
    ("encode / decode", PALETTE[4], r"^(stage\d+_(encode|decode)|result_decode)_mean_s$"),
    ("seal / open (--encrypt)", PALETTE[5], r"^(stage\d+_(seal|open)|result_open)_mean_s$"),
    ("transfer (network, waiting for the link)", PALETTE[1], r"^transfer_mean_s$"),
    ("queueing (waiting for a later stage)", PALETTE[3], r"^stage\d+_queue_mean_s$"),
    ("later stages' compute", PALETTE[2], r"^stage([2-9]|\d\d+)_compute_mean_s$"),
)


def breakdown_parts(table: pd.DataFrame) -> list[tuple[str, str, np.ndarray]]:
    """(label, colour, seconds per row) of each stacked part; tests check they sum to the latency."""
    import re

    out = []
    for label, colour, pattern in BREAKDOWN_PARTS:
        cols = [c for c in table.columns if re.match(pattern, c)]
        values = table[cols].astype(float).fillna(0).sum(axis=1).to_numpy() if cols else np.zeros(len(table))
        out.append((label, colour, values))
    return out


def plot_breakdown(table: pd.DataFrame, fig, title: str) -> None:
    """Neurosurgeon-style, per split and network: compute, codecs, transfer, queueing and the later
    stages, stacked to the mean latency (marked), so nothing is left out."""
    networks = list(dict.fromkeys(table["network"]))
    axes = fig.subplots(1, len(networks), squeeze=False)[0]
    for ax, network in zip(axes, networks):
        grp = _by_split(table[table["network"] == network])
        x = np.arange(len(grp))
        bottom = np.zeros(len(grp))
        for label, colour, values in breakdown_parts(grp):
            ax.bar(x, values * 1e3, bottom=bottom, color=colour, label=label)
            bottom += values * 1e3
        if "latency_mean_s" in grp.columns:
            ax.plot(x, grp["latency_mean_s"].astype(float) * 1e3, "k_", ms=10, mew=1.5, label="mean latency")
        ax.set_xticks(x, [str(k) for k in grp["split_index"]], fontsize=7)
        ax.set_xlabel("split index k")
        ax.set_title(network)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("time per batch, mean (ms)")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)


def plot_vs_split(table: pd.DataFrame, fig, title: str, objectives: Sequence[Any] = ()) -> None:
    """Two objectives against the split, a 95% CI band each (by default latency and throughput, or a
    language model's time to first token and time per token)."""
    first, second = objectives or main_pair(table)
    if not objectives and first is LATENCY:  # by default summary.csv's median latency, which the band is of
        first = dataclasses.replace(LATENCY, column="latency_median_s")
    axes = fig.subplots(1, 2)
    order = [str(k) for k in _by_split(table.drop_duplicates("split_index"))["split_index"]]
    for i, (network, grp) in enumerate(table.groupby("network", sort=False)):
        grp = _by_split(grp)
        c = PALETTE[i % len(PALETTE)]
        k = [order.index(str(v)) for v in grp["split_index"]]
        for ax, o in zip(axes, (first, second)):
            scale, _ = _axis(o.column, o.label)
            ax.plot(k, grp[o.column] * scale, "-o", color=c, ms=3, label=network)
            if o.low in grp.columns and o.high in grp.columns:
                ax.fill_between(k, grp[o.low] * scale, grp[o.high] * scale, color=c, alpha=0.2)
    if first.column == "latency_median_s" and second is THROUGHPUT:  # as it has always been labelled
        axes[0].set_yscale("log")
        plain_log_ticks(axes[0].yaxis)
        axes[0].set(xlabel="split index k", ylabel="latency per batch, median (ms, log)", title="latency (95% CI band)")
        axes[1].set(xlabel="split index k", ylabel="throughput (images/s)", title="throughput (95% CI band)")
    else:
        for ax, o in zip(axes, (first, second)):
            ax.set(xlabel="split index k", ylabel=_axis(o.column, o.label)[1], title=f"{o.name} (95% CI band)")
    for ax in axes:
        ax.set_xticks(range(len(order)), order, fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)


def plot_payload(table: pd.DataFrame, ax, title: str) -> None:
    """What crosses the first cut per image (a language model: per token, a decode step's)."""
    item = workload.of_table(table).item
    grp = _by_split(table.drop_duplicates("split_index"))
    x = np.arange(len(grp))
    values = grp["bytes_per_token"] if item == "token" else grp["payload_bytes_mean"] / grp["batch_size"]
    ax.bar(x, values, color=PALETTE[0])
    ax.set_xticks(x, [str(k) for k in grp["split_index"]], fontsize=7)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set(xlabel="split index k", ylabel=f"bytes sent stage 1 -> 2 per {item} (log)",
           title=title)
    ax.grid(True, axis="y", alpha=0.3)


#: What each figure of a panel needs, per row, to draw anything: finite positive values in these
#: columns (the log-scaled axes among them cannot show zero or a gap).
FIGURE_NEEDS = {"front": ("latency_s", "throughput_imgs_per_s"), "objectives": ("latency_s", "throughput_imgs_per_s"),
                "breakdown": ("latency_s",), "vs_split": ("latency_median_s", "throughput_imgs_per_s"),
                "payload": ("payload_bytes_mean",)}
#: A language model's panel: its fronts and curves are over its token figures.
GENERATION_NEEDS = {"front": ("ttft_median_s", "tpot_median_s"), "objectives": ("ttft_median_s", "tpot_median_s"),
                    "tokens_memory": ("tokens_per_s", "memory_model_bytes"), "breakdown": ("latency_s",),
                    "vs_split": ("ttft_median_s", "tpot_median_s"), "payload": ("bytes_per_token",)}
#: Each workload's (by its name).
NEEDS = {workload.IMAGES.name: FIGURE_NEEDS, workload.GENERATION.name: GENERATION_NEEDS}


def nothing_to_draw(table: pd.DataFrame, figure: str, kind: workload.Workload = workload.IMAGES) -> str | None:
    """Why ``figure`` (a key of ``kind``'s :data:`NEEDS`) has nothing to draw from ``table``, or None."""
    needs = NEEDS[kind.name][figure]
    missing = [c for c in needs if c not in table.columns]
    if missing:
        return f"the table has no {missing[0]} column"
    values = table[list(needs)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    if not (np.isfinite(values) & (values > 0)).all(axis=1).any():
        return f"no configuration has a measured {' and '.join(needs)} above zero"
    return None


def plain_log_ticks(axis: Any) -> None:
    """Label a log axis in plain numbers, at 1, 2 and 5 of each decade: matplotlib's default labels
    every minor tick of a short range as 3x10^1, 4x10^1, ..., and the labels run into each other
    (and each is a mathtext parse: an eighth of a report's CPU). A range too short to hold two of
    those (27 to 29 ms, say) labels each of its ticks instead: it would otherwise show no number."""
    from matplotlib.ticker import FuncFormatter

    def minor(v: float, _: Any) -> str:
        if len(_one_two_five(*axis.get_view_interval())) < 2:
            return f"{v:.4g}"
        return f"{v:g}" if _one_two_five(v, v) and not math.isclose(v, 10 ** round(math.log10(v))) else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _one_two_five(low: float, high: float) -> list[float]:
    """The values 1, 2 and 5 times a power of ten between ``low`` and ``high`` (either order)."""
    low, high = sorted((low, high))
    if not 0 < low <= high or not math.isfinite(high):
        return []
    marks = (m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
             for m in (1, 2, 5))
    return [v for v in marks if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed, e.g. in CI or over SSH)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 130) -> Path:
    """Write ``fig`` atomically (a temp file in the same folder, then rename) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, dpi=dpi)
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path




def plot_objective_matrix(table: pd.DataFrame, objectives: Sequence[Any], fig, title: str) -> None:
    """Every pair of objectives (three or more) as a scatter, one colour per network, front points
    outlined: where two objectives agree and where they pull apart."""
    n = len(objectives)
    axes = fig.subplots(n, n, squeeze=False)
    colours = _colours(list(dict.fromkeys(table["network"])))
    front = table.get("front_status", pd.Series("", index=table.index)).eq("front")
    for i, yo in enumerate(objectives):
        for j, xo in enumerate(objectives):
            ax = axes[i][j]
            if j >= i:
                ax.axis("off")
                if i == j:
                    ax.text(0.5, 0.5, xo.label, ha="center", va="center", fontsize=8, wrap=True,
                            transform=ax.transAxes)
                continue
            for network, colour in colours.items():
                rows = table["network"] == network
                ax.scatter(table.loc[rows & ~front, xo.column], table.loc[rows & ~front, yo.column], s=10,
                           color=colour, alpha=0.4)
                ax.scatter(table.loc[rows & front, xo.column], table.loc[rows & front, yo.column], s=28,
                           color=colour, edgecolors="black", linewidths=0.8, label=network if (i, j) == (1, 0) else None)
            ax.tick_params(labelsize=6)
            if i == n - 1:
                ax.set_xlabel(xo.label, fontsize=7)
            if j == 0:
                ax.set_ylabel(yo.label, fontsize=7)
    axes[1][0].legend(fontsize=6)
    fig.suptitle(title)
