"""Pareto report of a sweep session: ``pareto.csv`` and the figures, from runs.csv/summary.csv.

``python -m paretopipe.report RESULTS_DIR [--out DIR] [--format png|svg|pdf]``. RESULTS_DIR is a
session folder (holding runs.csv) or a results folder, whose newest session is used.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from . import pareto, records
from .errors import UsageError

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
OBJECTIVES = pareto.DEFAULT_OBJECTIVES
CONFIG = ["model", "backend", "profile", "batch_size", "split_index"]
PANEL = ["model", "backend", "batch_size"]


def find_session(path: str | Path) -> Path:
    """A session folder itself, or the newest session inside a results folder."""
    path = Path(path)
    if (path / "runs.csv").is_file():
        return path
    sessions = sorted((p.parent for p in path.glob("*/runs.csv")), key=lambda p: p.stat().st_mtime)
    if not sessions:
        raise UsageError(f"no sweep results under {path} (expected runs.csv in it or in a session folder inside)")
    return sessions[-1]


def load_runs(session: str | Path) -> pd.DataFrame:
    runs = pd.read_csv(Path(session) / "runs.csv")
    runs["latency_s"] = runs["latency_median_s"]
    return runs


def load_configs(session: str | Path) -> pd.DataFrame:
    """Per-configuration medians over runs (summary.csv), with ``latency_s`` = median latency."""
    summary = pd.read_csv(Path(session) / "summary.csv")
    summary["latency_s"] = summary["latency_median_s"]
    return summary


def pareto_table(session: str | Path, resamples: int = 200) -> pd.DataFrame:
    """Every configuration with on_front, robustness, knee flag, and its group's hypervolume."""
    configs = load_configs(session)
    runs = load_runs(session)
    if configs.empty:
        return configs.assign(on_front=[], front_robustness=[], knee=[], hypervolume=[])
    table = pareto.mark_front(configs, OBJECTIVES, pareto.DEFAULT_GROUP)
    rob = pareto.robustness(runs, CONFIG, OBJECTIVES, pareto.DEFAULT_GROUP, resamples=resamples)
    table = table.join(rob, on=CONFIG)
    table["front_robustness"] = table["front_robustness"].fillna(0.0)
    table["knee"] = False
    table["hypervolume"] = np.nan
    senses = list(OBJECTIVES.values())
    # Normalise per model/backend/batch over every profile, so hypervolumes compare across profiles.
    for _, panel in table.groupby(PANEL):
        values = panel[list(OBJECTIVES)].to_numpy(dtype=float)
        lower, upper = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
        for _, grp in panel.groupby("profile"):
            on = grp[grp["on_front"]]
            if on.empty:
                continue
            norm = pareto.normalise(on[list(OBJECTIVES)].to_numpy(dtype=float), senses, lower, upper)
            table.loc[grp.index, "hypervolume"] = pareto.hypervolume_2d(norm)
            table.loc[on.index[pareto.knee(norm)], "knee"] = True
    return table


def front_plot_data(table: pd.DataFrame) -> list[dict[str, Any]]:
    """What a front figure draws, point by point: tests check every label names its point."""
    out = []
    for _, row in table.iterrows():
        out.append({"profile": row["profile"], "x": float(row["latency_s"]), "y": float(row["throughput_imgs_per_s"]),
                    "label": f"k={int(row['split_index'])}", "split_index": int(row["split_index"]),
                    "on_front": bool(row["on_front"]), "knee": bool(row.get("knee", False))})
    return out


def front_line(points: list[dict[str, Any]], profile: str) -> list[tuple[float, float]]:
    """The front of one profile as a polyline in latency order."""
    pts = sorted((p["x"], p["y"]) for p in points if p["profile"] == profile and p["on_front"])
    return pts


def _colours(profiles: Sequence[str]) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(profiles)}


def plot_fronts(table: pd.DataFrame, ax, title: str) -> list[dict[str, Any]]:
    points = front_plot_data(table)
    colours = _colours(list(dict.fromkeys(table["profile"])))
    for profile, colour in colours.items():
        mine = [p for p in points if p["profile"] == profile]
        ax.scatter([p["x"] * 1e3 for p in mine if not p["on_front"]], [p["y"] for p in mine if not p["on_front"]],
                   color=colour, alpha=0.35, s=22)
        line = front_line(points, profile)
        ax.plot([x * 1e3 for x, _ in line], [y for _, y in line], "-o", color=colour, ms=6, lw=1.8,
                label=f"{profile} front")
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
    """Neurosurgeon-style: stage-1 compute, transfer, stage-2 compute per split, one panel per profile."""
    profiles = list(dict.fromkeys(table["profile"]))
    axes = fig.subplots(1, len(profiles), squeeze=False)[0]
    parts = [("stage1_compute_median_s", "stage 1 compute", PALETTE[0]), ("transfer_median_s", "transfer", PALETTE[1]),
             ("stage2_compute_median_s", "stage 2 compute", PALETTE[2])]
    for ax, profile in zip(axes, profiles):
        grp = table[table["profile"] == profile].sort_values("split_index")
        x = np.arange(len(grp))
        bottom = np.zeros(len(grp))
        for col, label, colour in parts:
            vals = grp[col].fillna(0).to_numpy() * 1e3
            ax.bar(x, vals, bottom=bottom, color=colour, label=label)
            bottom += vals
        ax.set_xticks(x, [str(int(k)) for k in grp["split_index"]], fontsize=7)
        ax.set_xlabel("split index k")
        ax.set_title(profile)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("time per batch, median (ms)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)


def plot_vs_split(table: pd.DataFrame, fig, title: str) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    for i, (profile, grp) in enumerate(table.groupby("profile", sort=False)):
        grp = grp.sort_values("split_index")
        c = PALETTE[i % len(PALETTE)]
        k = grp["split_index"]
        ax1.plot(k, grp["latency_median_s"] * 1e3, "-o", color=c, ms=3, label=profile)
        ax1.fill_between(k, grp["latency_median_ci95_low_s"] * 1e3, grp["latency_median_ci95_high_s"] * 1e3,
                         color=c, alpha=0.2)
        ax2.plot(k, grp["throughput_imgs_per_s"], "-o", color=c, ms=3, label=profile)
        ax2.fill_between(k, grp["throughput_ci95_low_imgs_per_s"], grp["throughput_ci95_high_imgs_per_s"],
                         color=c, alpha=0.2)
    ax1.set_yscale("log")
    ax1.set(xlabel="split index k", ylabel="latency per batch, median (ms, log)", title="latency (95% CI band)")
    ax2.set(xlabel="split index k", ylabel="throughput (images/s)", title="throughput (95% CI band)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)


def plot_payload(table: pd.DataFrame, ax, title: str) -> None:
    grp = table.drop_duplicates("split_index").sort_values("split_index")
    ax.bar(grp["split_index"], grp["payload_bytes_mean"] / grp["batch_size"], color=PALETTE[0])
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


def write_report(results: str | Path, out: str | Path | None = None, fmt: str = "png") -> Path:
    """Write pareto.csv and the figures; returns the output folder."""
    plt = pyplot()

    if fmt not in ("png", "svg", "pdf"):
        raise UsageError(f"--format {fmt!r}: valid png, svg, pdf")
    session = find_session(results)
    out = Path(out or session / "report")
    out.mkdir(parents=True, exist_ok=True)
    table = pareto_table(session)
    records.atomic_write_csv(out / "pareto.csv", table.to_dict("records"))
    for key, panel in table.groupby(PANEL):
        model, backend, batch = key
        stem = f"{model}_{backend}_b{batch}"
        title = f"{model}, {backend} backend, batch {batch}"
        fig, ax = plt.subplots(figsize=(8, 5.5))
        plot_fronts(panel, ax, f"Pareto fronts: {title}")
        fig.tight_layout()
        save_figure(fig, out / f"front_{stem}.{fmt}")
        fig = plt.figure(figsize=(4 * panel["profile"].nunique() + 1, 4.5))
        plot_breakdown(panel, fig, f"Where the time goes per split: {title}")
        fig.tight_layout()
        save_figure(fig, out / f"breakdown_{stem}.{fmt}")
        fig = plt.figure(figsize=(11, 4.5))
        plot_vs_split(panel, fig, f"Latency and throughput vs split: {title}")
        fig.tight_layout()
        save_figure(fig, out / f"vs_split_{stem}.{fmt}")
        fig, ax = plt.subplots(figsize=(7, 4))
        plot_payload(panel, ax, f"Payload per image vs split: {model}")
        fig.tight_layout()
        save_figure(fig, out / f"payload_{model}.{fmt}")
    return out


def format_front_table(table: pd.DataFrame) -> str:
    cols = ["model", "backend", "profile", "split_index", "cut", "latency_s", "throughput_imgs_per_s",
            "front_robustness", "knee", "hypervolume"]
    front = table[table["on_front"]][cols].sort_values(["model", "backend", "profile", "latency_s"])
    return front.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import HelpFormatter, add_common_flags, example_epilog, setup_logging

    p = argparse.ArgumentParser(prog="python -m paretopipe.report", formatter_class=HelpFormatter,
                                description="Pareto fronts, tables and figures of a sweep session.",
                                epilog=example_epilog("python -m paretopipe.report results",
                                                      "python -m paretopipe.report results/20261121-070107 --format svg"))
    p.add_argument("results", help="a session folder, or a results folder (newest session)")
    p.add_argument("--out", default=None, help="output folder (default SESSION/report)")
    p.add_argument("--format", default="png", choices=["png", "svg", "pdf"])
    add_common_flags(p)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    out = write_report(args.results, args.out, args.format)
    print(format_front_table(pd.read_csv(out / "pareto.csv")))
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    from .cli import run_cli

    raise SystemExit(run_cli(main))
