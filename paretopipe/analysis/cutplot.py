"""Where to cut a model, before measuring anything: the bytes that cross each cut against the
compute that stays on stage 1, for several models side by side (classifiers and detectors).

A cut where several tensors cross (a residual block's input beside its branch, a detector's
pyramid levels) can send less than every single-tensor cut around it; those are ringed in black."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plotting import PALETTE, pyplot, save_figure

_MARKERS = {1: "o", 2: "s", 3: "^"}


def plot_cuts(models: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """One panel per model from :func:`paretopipe.partition.tables.cut_rows`; returns the file."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 4.2), squeeze=False, sharey=True)
    for ax, (name, rows) in zip(axes[0], models.items()):
        for width in sorted({r["width"] for r in rows}):
            mine = [r for r in rows if r["width"] == width]
            ax.scatter([r["flops_before_pct"] for r in mine], [r["bytes_per_image"] for r in mine], s=18,
                       marker=_MARKERS.get(width, "D"), color=PALETTE[(width - 1) % len(PALETTE)], alpha=0.75,
                       label=f"{width} tensor{'s' if width > 1 else ''} ({len(mine)})")
        better = [r for r in rows if r["less_than_neighbours"]]
        ax.scatter([r["flops_before_pct"] for r in better], [r["bytes_per_image"] for r in better], s=60,
                   facecolors="none", edgecolors="black", linewidths=1.0,
                   label=f"less than the 1-tensor cuts around it ({len(better)})")
        ax.set_yscale("log")
        ax.set(title=name, xlabel="stage 1's share of the FLOPs (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("bytes across the cut per image (log)")
    fig.tight_layout()
    return save_figure(fig, Path(path))
