"""The report's bytes-against-accuracy panel (``fidelity_<model>_<network>.<fmt>``): per split, one
curve through the wire dtypes a session measured, the bytes each image sent across the cut
against what the lossy wire kept of the unsplit model (top-1 accuracy on a labelled folder, else
top-1 agreement). A float32 configuration that was not evaluated is drawn hollow at agreement 1:
its wire is lossless (its outputs equal the unsplit model's, which the tests check)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from .. import records
from .keys import split_sort_key
from .plotting import plain_log_ticks, save_figure

log = logging.getLogger("paretopipe.report")
GROUP = ["model", "backend", "network", "batch_size"]


def measure_of(table: pd.DataFrame) -> tuple[str, str] | None:
    """The column drawn and its label: accuracy where a labelled dataset gave it, else agreement."""
    for column, label in (("accuracy_top1", "top-1 accuracy"), ("fidelity_top1_agreement",
                                                                  "top-1 agreement with the unsplit float32 model")):
        if column in table.columns and table[column].notna().any():
            return column, label
    return None


def write(configs: pd.DataFrame, out: Path, plt: Any, fmt: str) -> list[Path]:
    """One figure per model, backend, network and batch size whose session measured a lossy wire
    dtype beside another; nothing otherwise."""
    measure = measure_of(configs)
    if measure is None or "codec" not in configs.columns or configs["codec"].nunique() < 2:
        return []
    written = []
    for key, group in configs[configs["status"].eq("complete")].groupby(GROUP):
        if group["codec"].nunique() < 2 or group[measure[0]].notna().sum() == 0:
            continue
        path = out / f"fidelity_{records.file_label('_'.join(str(k) for k in key))}.{fmt}"
        save_figure(figure(plt, group, measure, key), path)
        written.append(path)
    return written


def figure(plt: Any, group: pd.DataFrame, measure: tuple[str, str], key: tuple) -> Any:
    """One model, backend, network and batch size: a curve per split through its wire dtypes."""
    column, label = measure
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for split in sorted(group["split_index"].unique(), key=split_sort_key):
        rows = group[group["split_index"] == split].copy()
        rows["bytes"] = rows["wire_bytes_mean"] / rows["batch_size"]
        lossless = rows[column].isna() & rows["codec"].str.startswith("float32/")
        rows.loc[lossless, column] = 1.0 if column == "fidelity_top1_agreement" else float("nan")
        rows = rows[rows[column].notna()].sort_values("bytes")
        line, = ax.plot(rows["bytes"], rows[column], marker="o", label=f"k={split}")
        for _, r in rows.iterrows():
            ax.annotate(str(r["codec"]).split("/")[0], (r["bytes"], r[column]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
        hollow = rows[lossless.reindex(rows.index, fill_value=False)]
        ax.plot(hollow["bytes"], hollow[column], "o", mfc="white", color=line.get_color())
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel("bytes per image across the cut (wire)")
    ax.set_ylabel(label)
    ax.set_title(f"What the wire dtype costs: {key[0]}, {key[1]}, {key[2]}, batch {key[3]}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
