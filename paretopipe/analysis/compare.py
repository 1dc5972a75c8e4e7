"""Two sessions' fronts side by side: the points, the deltas, and which splits moved.

For every configuration both sessions measured (model, backend, cipher, network, batch size,
split), the latency and throughput of each with their relative change, and whether the split is on
each session's front. Per front (model, backend, cipher, network, batch size): the front splits of A and of B,
which joined and which left, and the Jaccard index of the two sets. And how fast each stage ran in
B relative to A over the configurations both measured: two runs of one experiment on a shared
machine may land on devices whose relative speed moved, and the splits that balance the pipeline
move with it, beyond either session's own intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import records, workload
from ..errors import UsageError
from ..workload import GENERATION, IMAGES
from .plotting import front_axes, front_line, front_plot_data, plain_log_ticks, pyplot, save_figure
from .report import GROUP, pareto_table
from . import objectives as objectives_mod, pareto
from .keys import CONFIG_KEY, PANEL_KEY, ordered_splits, panel_names, split_sort_key
from .session import Session, find_session, sessions_under
from .sanity import monotone_violations

METRICS = ("latency_s", "throughput_imgs_per_s")
STAGE_COMPUTE = ("stage1_compute_median_s", "stage2_compute_median_s")
#: A language model's session: its fronts' axes, and each stage's compute per decode step.
GENERATION_METRICS = ("ttft_median_s", "tpot_median_s")
GENERATION_STAGE_COMPUTE = ("stage1_decode_compute_median_s", "stage2_decode_compute_median_s")


def metrics_of(table: pd.DataFrame) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the fronts' two columns, each stage's compute column) of a session's table."""
    return {IMAGES: (METRICS, STAGE_COMPUTE),
            GENERATION: (GENERATION_METRICS, GENERATION_STAGE_COMPUTE)}[workload.of_table(table)]
#: Stages computing less than this in A (an empty stage 1 at k = 0) say nothing about its speed.
MIN_STAGE_S = 1e-3


def _front_set(frame: pd.DataFrame) -> set[str]:
    return {str(k) for k in frame.loc[frame["on_front"].astype(bool), "split_index"]}


def _epsilon_front(frame: pd.DataFrame) -> set[str]:
    """The splits the data cannot tell apart from the best: the epsilon-front (front or tied,
    :func:`pareto.front_status`)."""
    if "front_status" not in frame.columns:
        return _front_set(frame)
    return {str(k) for k in frame.loc[frame["front_status"].isin(["front", "tied"]), "split_index"]}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if (a or b) else 1.0


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, fronts): one row per configuration in both sessions, and one per front."""
    metrics, compute = metrics_of(a)
    keep = CONFIG_KEY + list(metrics) + list(compute) + ["on_front", "front_status"]
    left = a[[c for c in keep if c in a.columns]].copy()
    right = b[[c for c in keep if c in b.columns]].copy()
    for frame in (left, right):
        frame["split_index"] = frame["split_index"].astype(str)
    points = left.merge(right, on=CONFIG_KEY, how="inner", suffixes=("_a", "_b"))
    points.attrs["metrics"], points.attrs["compute"] = metrics, compute
    for m in metrics:
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
        ta, tb = _epsilon_front(left[sel_a]), _epsilon_front(right[sel_b])
        fronts.append({**dict(zip(GROUP, key)), "front_a": " ".join(ordered_splits(fa)),
                       "front_b": " ".join(ordered_splits(fb)), "joined": " ".join(ordered_splits(fb - fa)),
                       "left": " ".join(ordered_splits(fa - fb)), "jaccard": jaccard(fa, fb),
                       "epsilon_front_a": " ".join(ordered_splits(ta)), "epsilon_front_b": " ".join(ordered_splits(tb)),
                       "jaccard_epsilon": jaccard(ta, tb)})
    return points, pd.DataFrame(fronts)


def stage_speed(points: pd.DataFrame) -> dict[str, float | None]:
    """Per stage, the median over shared configurations of B's compute time / A's (paired by
    configuration, so the splits' different work cancels): 0.8 means B's device ran 20% faster."""
    out: dict[str, float | None] = {}
    for j, col in enumerate(points.attrs.get("compute", STAGE_COMPUTE), start=1):
        if f"{col}_a" not in points or f"{col}_b" not in points:
            out[f"stage{j}"] = None
            continue
        a, b = points[f"{col}_a"].astype(float), points[f"{col}_b"].astype(float)
        ratio = (b / a)[(a > MIN_STAGE_S) & (b > 0)].dropna()
        out[f"stage{j}"] = float(ratio.median()) if len(ratio) else None
    return out


def format_stage_speed(speed: dict[str, float | None]) -> str:
    shown = ", ".join(f"{stage} {ratio:.2f}" for stage, ratio in speed.items() if ratio is not None)
    if not shown:
        return "stage compute, B / A: not recorded in both sessions"
    return (f"stage compute, B / A (median over shared configurations): {shown}; the splits that balance the "
            f"pipeline move when the stages' speeds move apart")


def compare(a_dir: str | Path, b_dir: str | Path, out: str | Path | None = None, fmt: str = "png",
            objectives: str | None = None) -> dict[str, Any]:
    """Compare two sessions; with ``out``, write compare_points.csv, compare_fronts.csv and a figure
    per panel (both fronts of every network in one plot)."""
    sa, sb = find_session(a_dir), find_session(b_dir)
    ta, tb = pareto_table(sa, objectives=objectives), pareto_table(sb, objectives=objectives)
    points, fronts = compare_tables(ta, tb)
    if points.empty:
        raise UsageError(f"{sa.path} and {sb.path} share no configuration (model, backend, cipher, network, batch "
                         f"size, split); nothing to compare")
    for side, session, table in (("a", sa, ta), ("b", sb, tb)):
        fronts[f"self_agreement_{side}"] = self_agreement(session, table, fronts)
    result = {"a": sa.path, "b": sb.path, "points": points, "fronts": fronts, "stage_speed": stage_speed(points),
              "files": []}
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
        x, y = front_axes(panel_a)
        ys = 1e3 if y.column.endswith("median_s") else 1.0  # a time is drawn in ms
        for i, network in enumerate(dict.fromkeys(panel_a["network"])):
            colour = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
            for panel, style, name in ((panel_a, "-o", name_a), (panel_b, "--s", name_b)):
                pts = front_plot_data(panel[panel["network"] == network], x.column, y.column)
                line = front_line(pts, network)
                if line:
                    ax.plot([a * 1e3 for a, _ in line], [b * ys for _, b in line], style, color=colour, ms=5,
                            label=f"{network}: {name}")
                for p in pts:
                    if p["on_front"]:
                        ax.annotate(p["label"], (p["x"] * 1e3, p["y"] * ys), fontsize=7, color=colour,
                                    xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        title, stem = panel_names(key, ta["in_flight"].nunique() > 1)
        ax.set(xlabel=x.label.replace("(s)", "(ms, log)"), ylabel=y.label.replace("(s)", "(ms)"),
               title=f"{title}: {name_a} (solid) vs {name_b} (dashed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(save_figure(fig, out / f"compare_{stem}.{fmt}"))
    return files


def format_comparison(result: dict[str, Any]) -> str:
    points, fronts = result["points"], result["fronts"]
    lines = [f"A = {result['a']}", f"B = {result['b']}", "", "fronts (splits on each front, what moved):"]
    show = fronts.rename(columns={"front_a": "front A", "front_b": "front B", "epsilon_front_a": "epsilon-front A",
                                  "epsilon_front_b": "epsilon-front B", "jaccard_epsilon": "jaccard eps"})
    lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    lines += ["", format_stage_speed(result["stage_speed"]), "", "points (B relative to A):"]
    metrics = points.attrs.get("metrics", METRICS)
    table = points[GROUP + ["split_index", *(f"{m}_{s}" for m in metrics for s in ("a", "b", "change")),
                            "front"]].copy()
    for col in (f"{m}_change" for m in metrics):
        table[col] = [f"{v:+.1%}" if np.isfinite(v) else "" for v in table[col]]
    lines.append(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return "\n".join(lines)


def _finished(session: Path) -> bool:
    """A sweep that ran to its end: an interrupted or failed one has no summary to compare."""
    try:
        meta = Session(session).read_meta()
    except UsageError:  # session.json unreadable
        return False
    return meta is not None and meta.get("complete") is True and bool(meta.get("runs_complete"))


def newest_two(results: str | Path) -> tuple[Path, Path]:
    """The two newest finished sessions under a results folder (older first)."""
    root = Path(results)
    sessions = [p for p in sessions_under(root) if _finished(p)]
    if len(sessions) < 2:
        raise UsageError(f"{root} holds {len(sessions)} finished session(s); comparing the newest two needs two "
                         f"(run the sweep again)")
    return sessions[-2], sessions[-1]


def self_agreement(session: Session, table: pd.DataFrame, fronts: pd.DataFrame) -> list[float | None]:
    """Per row of ``fronts``: how well the session agrees with itself on that front
    (:func:`pareto.resampled_front_agreement`, its own noise as epsilon); None without repeated runs."""
    chosen = objectives_mod.parse(table.attrs.get("objectives"), table)
    senses, intervals = objectives_mod.senses(chosen), objectives_mod.intervals(chosen)
    runs = session.runs()
    runs = runs.assign(latency_s=runs["latency_median_s"]) if "latency_median_s" in runs else runs
    keyed = [c for c in GROUP if c in runs]  # runs.csv of an older session may lack a key column
    out = []
    for _, row in fronts.iterrows():
        key = pd.Series([str(row[c]) for c in GROUP], index=GROUP)
        mine = table[(table[GROUP].astype(str) == key).all(axis=1)]
        its_runs = runs[(runs[keyed].astype(str) == key[keyed]).all(axis=1)]
        eps = pareto.interval_epsilon(mine, intervals, senses)
        out.append(pareto.resampled_front_agreement(its_runs, ["split_index"], senses, eps))
    return out


def _unjudged(row: pd.Series) -> str:
    own = " and ".join(f"{side.upper()} {row[f'self_agreement_{side}']:.2f}" for side in ("a", "b")
                       if row.get(f"self_agreement_{side}") is not None)
    return f" (not judged: each session against itself {own})"


def goals(result: dict[str, Any], min_jaccard: float, selective: dict[str, int]) -> tuple[list[str], bool]:
    """Reproducibility goals of two runs of one experiment: per network the epsilon-fronts agree
    with Jaccard >= ``min_jaccard``; on the ``selective`` networks neither set holds a split k <= the
    given bound (the epsilon-front must stay selective); and B's stage-1 compute is monotone in k."""
    lines, met = [], True
    fronts = result["fronts"]
    # A front that either session does not reproduce against its own runs cannot be reproduced by
    # the other: it is shown, not judged (the same rule as predict --validate's).
    judged = [pareto.reproduces(r.get("self_agreement_a"), min_jaccard)
              and pareto.reproduces(r.get("self_agreement_b"), min_jaccard) for _, r in fronts.iterrows()]
    worst = fronts.loc[judged, "jaccard_epsilon"].min() if any(judged) else None
    ok = worst is None or bool(worst >= min_jaccard)
    met &= ok
    per = ", ".join(f"{r['network']} {r['jaccard_epsilon']:.2f}" + ("" if j else _unjudged(r))
                    for j, (_, r) in zip(judged, fronts.iterrows()))
    lines.append(f"epsilon-fronts agree run to run: {per} (goal >= {min_jaccard:g} where each session reproduces its "
                 f"own front: {'met' if ok else 'NOT met'})")
    for network, kmax in selective.items():
        rows = fronts[fronts["network"] == network]
        early = sorted({k for _, r in rows.iterrows() for col in ("epsilon_front_a", "epsilon_front_b")
                        for k in str(r[col]).split() if k.isdigit() and int(k) <= kmax})
        ok = not early and not rows.empty
        met &= ok
        lines.append(f"{network}: epsilon-fronts leave out k <= {kmax} ({'met' if ok else 'NOT met: ' + (' '.join(early) or 'network not in both sessions')})")
    summary = find_session(result["b"]).configs()
    bad = monotone_violations(summary, 1, rising=True)
    ok = not bad
    met &= ok
    lines.append(f"stage-1 compute is monotone in k within its CIs: {'met' if ok else 'NOT met (' + str(len(bad)) + ' violations)'}")
    if "stage_speed" in result:  # not a goal: what the two sessions' devices were like
        lines.append(format_stage_speed(result["stage_speed"]))
    return lines, met
