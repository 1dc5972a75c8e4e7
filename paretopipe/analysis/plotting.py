"""Figures of a session: Pareto fronts, where the time goes per split, latency and throughput
versus split, payload per split. Every figure is written atomically on the file-only Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def front_plot_data(table: pd.DataFrame) -> list[dict[str, Any]]:
    """What a front figure draws, point by point: tests check every label names its point."""
    out = []
    for _, row in table.iterrows():
        out.append({"network": row["network"], "x": float(row["latency_s"]), "y": float(row["throughput_imgs_per_s"]),
                    "label": f"k={row['split_index']}", "split_index": row["split_index"],
                    "on_front": bool(row["on_front"]), "knee": bool(row.get("knee", False))})
    return out


def front_line(points: list[dict[str, Any]], network: str) -> list[tuple[float, float]]:
    """The front of one network as a polyline in latency order."""
    pts = sorted((p["x"], p["y"]) for p in points if p["network"] == network and p["on_front"])
    return pts


def _by_split(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in split order (block index, then plans, then adaptive), whatever the column's dtype."""
    from .session import split_sort_key

    return frame.iloc[sorted(range(len(frame)), key=lambda i: split_sort_key(frame["split_index"].iloc[i]))]


def _colours(networks: Sequence[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(networks)}


def plot_fronts(table: pd.DataFrame, ax, title: str) -> list[dict[str, Any]]:
    points = front_plot_data(table)
    colours = _colours(list(dict.fromkeys(table["network"])))
    for network, colour in colours.items():
        mine = [p for p in points if p["network"] == network]
        ax.scatter([p["x"] * 1e3 for p in mine if not p["on_front"]], [p["y"] for p in mine if not p["on_front"]],
                   color=colour, alpha=0.35, s=22)
        line = front_line(points, network)
        ax.plot([x * 1e3 for x, _ in line], [y for _, y in line], "-o", color=colour, ms=6, lw=1.8,
                label=f"{network} front")
        for p in mine:
            ax.annotate(p["label"] + (" (knee)" if p["knee"] else ""), (p["x"] * 1e3, p["y"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points", color=colour,
                        fontweight="bold" if p["on_front"] else "normal")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency per batch, median (ms, log scale)")
    ax.set_ylabel("throughput (images/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return points


def plot_breakdown(table: pd.DataFrame, fig, title: str) -> None:
    """Neurosurgeon-style: stage-1 compute, transfer, stage-2 compute per split, one panel per network."""
    networks = list(dict.fromkeys(table["network"]))
    axes = fig.subplots(1, len(networks), squeeze=False)[0]
    parts = [("stage1_compute_median_s", "stage 1 compute", PALETTE[0]), ("transfer_median_s", "transfer", PALETTE[1]),
             ("stage2_compute_median_s", "stage 2 compute", PALETTE[2])]
    for ax, network in zip(axes, networks):
        grp = _by_split(table[table["network"] == network])
        x = np.arange(len(grp))
        bottom = np.zeros(len(grp))
        for col, label, colour in parts:
            vals = grp[col].fillna(0).to_numpy() * 1e3
            ax.bar(x, vals, bottom=bottom, color=colour, label=label)
            bottom += vals
        ax.set_xticks(x, [str(k) for k in grp["split_index"]], fontsize=7)
        ax.set_xlabel("split index k")
        ax.set_title(network)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("time per batch, median (ms)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)


def plot_vs_split(table: pd.DataFrame, fig, title: str) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    order = [str(k) for k in _by_split(table.drop_duplicates("split_index"))["split_index"]]
    for i, (network, grp) in enumerate(table.groupby("network", sort=False)):
        grp = _by_split(grp)
        c = PALETTE[i % len(PALETTE)]
        k = [order.index(str(v)) for v in grp["split_index"]]
        ax1.plot(k, grp["latency_median_s"] * 1e3, "-o", color=c, ms=3, label=network)
        ax1.fill_between(k, grp["latency_median_ci95_low_s"] * 1e3, grp["latency_median_ci95_high_s"] * 1e3,
                         color=c, alpha=0.2)
        ax2.plot(k, grp["throughput_imgs_per_s"], "-o", color=c, ms=3, label=network)
        ax2.fill_between(k, grp["throughput_ci95_low_imgs_per_s"], grp["throughput_ci95_high_imgs_per_s"],
                         color=c, alpha=0.2)
    ax1.set_yscale("log")
    ax1.set(xlabel="split index k", ylabel="latency per batch, median (ms, log)", title="latency (95% CI band)")
    ax2.set(xlabel="split index k", ylabel="throughput (images/s)", title="throughput (95% CI band)")
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(order)), order, fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)


def plot_payload(table: pd.DataFrame, ax, title: str) -> None:
    grp = _by_split(table.drop_duplicates("split_index"))
    x = np.arange(len(grp))
    ax.bar(x, grp["payload_bytes_mean"] / grp["batch_size"], color=PALETTE[0])
    ax.set_xticks(x, [str(k) for k in grp["split_index"]], fontsize=7)
    ax.set_yscale("log")
    ax.set(xlabel="split index k", ylabel="bytes sent stage 1 -> 2 per image (log)", title=title)
    ax.grid(True, axis="y", alpha=0.3)


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


