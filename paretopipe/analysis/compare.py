"""Two sessions' fronts side by side: the points, the deltas, and which splits moved.

For every configuration both sessions measured (model, backend, network, batch size, split), the
latency and throughput of each with their relative change, and whether the split is on each
session's front. Per front (model, backend, network, batch size): the front splits of A and of B,
which joined and which left, and the Jaccard index of the two sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import records
from ..errors import UsageError
from .plotting import front_line, front_plot_data, pyplot, save_figure
from .report import GROUP, pareto_table
from .session import CONFIG_KEY, PANEL_KEY, find_session, ordered_splits, split_sort_key

METRICS = ("latency_s", "throughput_imgs_per_s")


def _front_set(frame: pd.DataFrame) -> set[str]:
    return {str(k) for k in frame.loc[frame["on_front"].astype(bool), "split_index"]}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if (a or b) else 1.0


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, fronts): one row per configuration in both sessions, and one per front."""
    keep = CONFIG_KEY + list(METRICS) + ["on_front"]
    left = a[[c for c in keep if c in a.columns]].copy()
    right = b[[c for c in keep if c in b.columns]].copy()
    for frame in (left, right):
        frame["split_index"] = frame["split_index"].astype(str)
    points = left.merge(right, on=CONFIG_KEY, how="inner", suffixes=("_a", "_b"))
    for m in METRICS:
        points[f"{m}_change"] = (points[f"{m}_b"] - points[f"{m}_a"]) / points[f"{m}_a"]

    def moved(row: pd.Series) -> str:
        was, now = bool(row["on_front_a"]), bool(row["on_front_b"])
        return {(True, True): "stays on front", (False, True): "joined front", (True, False): "left front"}.get(
            (was, now), "")

    points["front"] = points.apply(moved, axis=1) if len(points) else []
    points = points.iloc[sorted(range(len(points)), key=lambda i: (
        tuple(str(points[c].iloc[i]) for c in GROUP), split_sort_key(points["split_index"].iloc[i])))]
    fronts = []
    shared = set(map(tuple, left[GROUP].astype(str).values)) & set(map(tuple, right[GROUP].astype(str).values))
    for key in sorted(shared):
        sel_a = (left[GROUP].astype(str) == pd.Series(key, index=GROUP)).all(axis=1)
        sel_b = (right[GROUP].astype(str) == pd.Series(key, index=GROUP)).all(axis=1)
        fa, fb = _front_set(left[sel_a]), _front_set(right[sel_b])
        fronts.append({**dict(zip(GROUP, key)), "front_a": " ".join(ordered_splits(fa)),
                       "front_b": " ".join(ordered_splits(fb)), "joined": " ".join(ordered_splits(fb - fa)),
                       "left": " ".join(ordered_splits(fa - fb)), "jaccard": jaccard(fa, fb)})
    return points, pd.DataFrame(fronts)


def compare(a_dir: str | Path, b_dir: str | Path, out: str | Path | None = None, fmt: str = "png") -> dict[str, Any]:
    """Compare two sessions; with ``out``, write compare_points.csv, compare_fronts.csv and a figure
    per panel (both fronts of every network in one plot)."""
    sa, sb = find_session(a_dir), find_session(b_dir)
    ta, tb = pareto_table(sa), pareto_table(sb)
    points, fronts = compare_tables(ta, tb)
    if points.empty:
        raise UsageError(f"{sa.path} and {sb.path} share no configuration (model, backend, network, batch size, "
                         f"split); nothing to compare")
    result = {"a": sa.path, "b": sb.path, "points": points, "fronts": fronts, "files": []}
    if out is not None:
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder")
        result["files"].append(records.atomic_write_csv(out / "compare_points.csv", points.to_dict("records")))
        result["files"].append(records.atomic_write_csv(out / "compare_fronts.csv", fronts.to_dict("records")))
        result["files"] += _figures(ta, tb, out, fmt, sa.path.name, sb.path.name)
    return result


def _figures(ta: pd.DataFrame, tb: pd.DataFrame, out: Path, fmt: str, name_a: str, name_b: str) -> list[Path]:
    plt = pyplot()
    files = []
    for key, panel_a in ta.groupby(PANEL_KEY):
        sel = (tb[PANEL_KEY].astype(str) == pd.Series([str(k) for k in key], index=PANEL_KEY)).all(axis=1)
        panel_b = tb[sel]
        if panel_b.empty:
            continue
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for i, network in enumerate(dict.fromkeys(panel_a["network"])):
            colour = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
            for panel, style, name in ((panel_a, "-o", name_a), (panel_b, "--s", name_b)):
                pts = front_plot_data(panel[panel["network"] == network])
                line = front_line(pts, network)
                if line:
                    ax.plot([x * 1e3 for x, _ in line], [y for _, y in line], style, color=colour, ms=5,
                            label=f"{network}: {name}")
                for p in pts:
                    if p["on_front"]:
                        ax.annotate(p["label"], (p["x"] * 1e3, p["y"]), fontsize=7, color=colour,
                                    xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set(xlabel="latency per batch, median (ms, log)", ylabel="throughput (images/s)",
               title=f"{key[0]}, {key[1]}, batch {key[2]}: {name_a} (solid) vs {name_b} (dashed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(save_figure(fig, out / f"compare_{records.file_label(f'{key[0]}_{key[1]}_b{key[2]}')}.{fmt}"))
    return files


def format_comparison(result: dict[str, Any]) -> str:
    points, fronts = result["points"], result["fronts"]
    lines = [f"A = {result['a']}", f"B = {result['b']}", "", "fronts (splits on each front, what moved):"]
    show = fronts.rename(columns={"front_a": "front A", "front_b": "front B"})
    lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    lines += ["", "points (B relative to A):"]
    table = points[GROUP + ["split_index", "latency_s_a", "latency_s_b", "latency_s_change",
                            "throughput_imgs_per_s_a", "throughput_imgs_per_s_b", "throughput_imgs_per_s_change",
                            "front"]].copy()
    for col in ("latency_s_change", "throughput_imgs_per_s_change"):
        table[col] = [f"{v:+.1%}" if np.isfinite(v) else "" for v in table[col]]
    lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return "\n".join(lines)
