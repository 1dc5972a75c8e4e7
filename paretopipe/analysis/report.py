"""Pareto report of a sweep session: ``pareto.csv`` and the figures, from runs.csv/summary.csv.

``paretopipe report RESULTS_DIR [--out DIR] [--format png|svg|pdf]``. RESULTS_DIR is a session
folder (holding runs.csv) or a results folder, whose newest session is used.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .. import records, workload
from ..errors import UsageError
from ..workload import GENERATION, IMAGES, Workload
from . import adaptive_comparison, loadgen_front, objectives as objectives_mod
from . import devices, engine_fronts, fidelity_plot, pareto, peer_gap, robustness
from .plotting import (nothing_to_draw, plot_breakdown, plot_fronts, plot_objective_matrix, plot_payload,
                       plot_vs_split, pyplot, save_figure)
from .session import Session, find_session
from .keys import CLOSED_LOOP, CONFIG_KEY, OPTIONAL_KEY, PANEL_KEY, panel_names
from .interactive import write_html
from .sanity import sanity_checks
from .privacy import privacy_cost
from .transport_cost import transport_cost

log = logging.getLogger("paretopipe.report")
OBJECTIVES = pareto.DEFAULT_OBJECTIVES
#: Sealed configurations beside their plain twins, when a session swept --encrypt with none.
PRIVACY_FILE = "privacy_cost.csv"
TRANSPORT_FILE = "transport_cost.csv"
#: The interactive page of every front (analysis.interactive).
HTML_FILE = "report.html"
GROUP = [k for k in CONFIG_KEY if k != "split_index"]  # one front per model, backend, cipher, network, batch
#: The 95% CI columns of latency and throughput in summary.csv (records.median_ci over runs).
INTERVALS = {"latency_s": ("latency_median_ci95_low_s", "latency_median_ci95_high_s"),
             "throughput_imgs_per_s": ("throughput_ci95_low_imgs_per_s", "throughput_ci95_high_imgs_per_s")}
#: The front table's figures before the chosen objectives', by workload.
FRONT_TABLE_MAIN = {IMAGES: ["latency_s", "throughput_imgs_per_s"],
                    GENERATION: ["ttft_median_s", "tpot_median_s", "tokens_per_s"]}


def pareto_table(session: Session | str | Path, resamples: int = 200,
                 objectives: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Every configuration with on_front, front_status (front, tied, dominated), robustness, knee
    flag, and its group's hypervolume with a bootstrap 95% CI, over ``objectives`` (names, see
    :mod:`.objectives`; latency and throughput by default). ``table.attrs["objectives"]`` names them."""
    session = session if isinstance(session, Session) else find_session(session)
    configs = session.configs()
    runs = session.runs()
    if configs.empty:
        return configs.assign(on_front=[], front_status=[], front_robustness=[], knee=[], hypervolume=[])
    chosen = objectives_mod.parse(objectives, configs)
    senses = objectives_mod.senses(chosen)  # the same column names per run (runs.csv) and per configuration
    table = pareto.mark_front(configs, senses, GROUP)
    table["front_status"] = pareto.front_status(table, objectives_mod.intervals(chosen), senses, GROUP)
    rob = pareto.robustness(runs, CONFIG_KEY, senses, GROUP, resamples=resamples)
    table = table.join(rob, on=CONFIG_KEY)
    table["front_robustness"] = table["front_robustness"].fillna(0.0)
    table["knee"] = False
    table["hypervolume"] = np.nan
    cols, directions = list(senses), list(senses.values())
    # Normalise per model/backend/batch over every network, so hypervolumes compare across networks.
    for _, panel in table.groupby(PANEL_KEY):
        values = panel[cols].to_numpy(dtype=float)
        if not np.isfinite(values).all(axis=1).any():
            continue  # nothing measured in this panel: no front, no hypervolume
        lower, upper = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
        for _, grp in panel.groupby("network"):
            on = grp[grp["on_front"]]
            if on.empty:
                continue
            norm = pareto.normalise(on[cols].to_numpy(dtype=float), directions, lower, upper)
            table.loc[grp.index, "hypervolume"] = pareto.hypervolume(norm)
            table.loc[on.index[pareto.knee(norm)], "knee"] = True
    ci = hypervolume_ci(runs, table, resamples, objectives=chosen)
    table = table.join(ci, on=GROUP)
    table.attrs["objectives"] = [o.name for o in chosen]
    table.attrs["objective_labels"] = {o.column: o.label for o in chosen}
    return table


def hypervolume_ci(runs: pd.DataFrame, table: pd.DataFrame, resamples: int = 200, seed: int = 0,
                   objectives: Sequence[objectives_mod.Objective] | None = None) -> pd.DataFrame:
    """95% bootstrap CI of each front's hypervolume: runs resampled per configuration, medians
    taken, fronts recomputed, normalised with the same bounds as the point estimate."""
    chosen = list(objectives or [objectives_mod.LATENCY, objectives_mod.THROUGHPUT])
    columns = [o.column for o in chosen]
    cols = ["hypervolume_ci95_low", "hypervolume_ci95_high"]
    usable = runs[runs.get("status", "complete").fillna("complete").eq("complete")] if "status" in runs else runs
    usable = usable.dropna(subset=[c for c in columns if c in usable.columns])
    if usable.empty or resamples < 1 or any(c not in usable.columns for c in columns):
        return pd.DataFrame(columns=cols, index=pd.MultiIndex.from_tuples([], names=GROUP))
    senses = [o.sense for o in chosen]
    panel_bounds = {}
    for key, panel in table.groupby(PANEL_KEY):
        values = panel[columns].to_numpy(dtype=float)
        panel_bounds[key] = (np.nanmin(values, axis=0), np.nanmax(values, axis=0))
    rng = np.random.default_rng(seed)
    grouped = {key: g[columns].to_numpy(dtype=float) for key, g in usable.groupby(CONFIG_KEY)}
    by_group: dict[tuple, list[tuple[tuple, int]]] = {}
    keys = list(grouped)
    at = [CONFIG_KEY.index(c) for c in GROUP]   # the key's front columns, wherever they stand in it
    for i, key in enumerate(keys):
        by_group.setdefault(tuple(key[j] for j in at), []).append((key, i))
    samples: dict[tuple, list[float]] = {g: [] for g in by_group}
    for _ in range(resamples):
        medians = np.array([np.median(v[rng.integers(0, len(v), len(v))], axis=0) for v in grouped.values()])
        for gkey, members in by_group.items():
            pts = medians[[i for _, i in members]]
            panel = tuple(gkey[GROUP.index(c)] for c in PANEL_KEY)
            if panel not in panel_bounds:
                continue
            front = pts[pareto.front_mask(pts, senses)]
            lower, upper = panel_bounds[panel]
            samples[gkey].append(pareto.hypervolume(pareto.normalise(front, senses, lower, upper)))
    rows = {g: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for g, v in samples.items() if v}
    out = pd.DataFrame.from_dict(rows, orient="index", columns=cols)
    out.index = pd.MultiIndex.from_tuples(list(rows), names=GROUP)
    return out


def write_report(results: str | Path, out: str | Path | None = None, fmt: str = "png",
                 objectives: str | Sequence[str] | None = None, predictions: pd.DataFrame | None = None) -> Path:
    """Write pareto.csv, the figures and report.html over ``objectives`` (latency and throughput by
    default); returns the output folder. ``predictions``: a predict table whose Server rates join
    the LoadGen front's (``loadgen_front.read_predictions``)."""
    plt = pyplot()
    if fmt not in ("png", "svg", "pdf"):
        raise UsageError(f"--format {fmt!r}: valid png, svg, pdf")
    session = find_session(results)
    out = Path(out or session.report_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the report")
    out.mkdir(parents=True, exist_ok=True)
    table = pareto_table(session, objectives=objectives)
    chosen = objectives_mod.parse(table.attrs.get("objectives"), table)
    records.atomic_write_csv(out / "pareto.csv", table.to_dict("records"))
    configs = session.configs()
    robust = robustness.write(configs, out)
    placed = devices.write(configs, chosen, out, devices.testbed_hosts(session.read_meta()))
    labels = {o.name: o.label for o in chosen}
    write_html(table, chosen, out / HTML_FILE, robustness.html_section(robust) + devices.html_section(placed, labels))
    checks = sanity_checks(configs, session.runs(), session.read_meta())
    records.atomic_write_csv(out / "sanity.csv", checks.to_dict("records"), list(checks.columns))
    cost = privacy_cost(table)
    if not cost.empty:
        records.atomic_write_csv(out / PRIVACY_FILE, cost.to_dict("records"), list(cost.columns))
    carried = transport_cost(table)
    if not carried.empty:
        records.atomic_write_csv(out / TRANSPORT_FILE, carried.to_dict("records"), list(carried.columns))
    loadgen_front.write(configs, out, predictions, plt, fmt)
    fidelity_plot.write(configs, out, plt, fmt)
    engine_fronts.write(table, out, plt, fmt)
    peer_gap.write(session, out, plt, fmt)
    depths = table["in_flight"].nunique() > 1
    for key, panel in table.groupby(PANEL_KEY):
        _panel_figures(plt, panel, key, chosen, out, fmt, depths)
    adaptive_comparison.write(session, out, fmt, plt)
    return out


@dataclasses.dataclass
class _PanelFigures:
    """The figures of one panel, each drawn by the method of its name. A language model's panel
    draws its token figures: time to first token against time per token, tokens/s against the
    largest stage's memory, both against the split, and the bytes per token."""

    plt: Any
    panel: pd.DataFrame
    key: tuple
    title: str
    chosen: Sequence[objectives_mod.Objective]

    @property
    def workload(self) -> Workload:
        return workload.of_table(self.panel)

    @property
    def default(self) -> bool:
        return [o.name for o in self.chosen] == list(objectives_mod.defaults(self.panel))

    def front(self) -> Any:
        fig, ax = self.plt.subplots(figsize=(8, 5.5))
        plot_fronts(self.panel, ax, f"Pareto fronts: {self.title}" + ("" if self.default else
                    f" (front over {', '.join(o.name for o in self.chosen)}; drawn on {self.workload.drawn_on})"),
                    line=self.default)
        return fig

    def tokens_memory(self) -> Any:
        pair = {objectives_mod.TOKENS.column: "max", "memory_model_bytes": "min"}
        marked = self.panel.drop(columns=["front_status", "knee"], errors="ignore")
        marked["on_front"] = pareto.mark_front(marked, pair, ["network"])["on_front"]
        fig, ax = self.plt.subplots(figsize=(8, 5.5))
        memory = objectives_mod.Objective("memory", "memory_model_bytes", "min",
                                          "largest stage's parameters and KV cache (bytes)")
        plot_fronts(marked, ax, f"Tokens/s against stage memory: {self.title}", x=memory, y=objectives_mod.TOKENS)
        return fig

    def objectives(self) -> Any:
        size = max(6, 2.6 * len(self.chosen))
        fig = self.plt.figure(figsize=(size, size))
        plot_objective_matrix(self.panel, self.chosen, fig, f"Every pair of objectives: {self.title}")
        return fig

    def breakdown(self) -> Any:
        fig = self.plt.figure(figsize=(4 * self.panel["network"].nunique() + 1, 4.5))
        plot_breakdown(self.panel, fig, f"Where the time goes per {self.workload.breakdown_unit}: {self.title}")
        return fig

    def vs_split(self) -> Any:
        fig = self.plt.figure(figsize=(11, 4.5))
        plot_vs_split(self.panel, fig, f"{self.workload.drawn_on.capitalize()} vs split: {self.title}")
        return fig

    def payload(self) -> Any:
        fig, ax = self.plt.subplots(figsize=(7, 4))
        plot_payload(self.panel, ax, f"Payload per {self.workload.item} vs split: {self.key[0]}")
        return fig


def _panel_figures(plt: Any, panel: pd.DataFrame, key: tuple, chosen: Sequence[objectives_mod.Objective],
                   out: Path, fmt: str, depths: bool = False) -> None:
    """The figures of one panel; one with nothing to draw is left out, with one line that says why
    (``depths``: the session holds several in-flight depths, named in the files)."""
    title, stem = panel_names(key, depths)
    figures = _PanelFigures(plt, panel, key, title, chosen)
    names = ["front", *figures.workload.figures] + \
        ([] if figures.default else ["objectives"]) + ["breakdown", "vs_split", "payload"]
    for name in names:
        path = out / (f"payload_{records.file_label(key[0])}.{fmt}" if name == "payload" else f"{name}_{stem}.{fmt}")
        why = nothing_to_draw(panel, name, figures.workload)
        if why is not None:
            log.warning("report: %s not drawn: %s", path.name, why)
            continue
        fig = getattr(figures, name)()
        fig.tight_layout()
        save_figure(fig, path)


def format_front_table(table: pd.DataFrame, columns: Sequence[str] = ()) -> str:
    """The epsilon-front: the front and the points tied with it (no point beats them by more than
    the network's measured noise, :func:`pareto.front_status`), the splits the data cannot tell
    apart from the best; ``columns``: the objectives' columns beyond latency and throughput."""
    main = FRONT_TABLE_MAIN[workload.of_table(table)]
    cols = ["model", "backend", "cipher", "transport", "codec", "in_flight", "scenario", "prompt_len", "fault",
            "placement", "engine", "network", "split_index", "cut", "front_status", *main, *[c for c in columns if c not in main],
            "front_robustness", "knee", "hypervolume", "hypervolume_ci95_low", "hypervolume_ci95_high"]
    sealed = "cipher" in table.columns and table["cipher"].fillna("none").ne("none").any()
    carried = "transport" in table.columns and table["transport"].fillna("tcp").ne("tcp").any()
    coded = "codec" in table.columns and table["codec"].fillna("float32/none").ne("float32/none").any()
    deep = "in_flight" in table.columns and table["in_flight"].nunique() > 1
    loaded = "scenario" in table.columns and table["scenario"].fillna(CLOSED_LOOP).ne(CLOSED_LOOP).any()
    # A key column another sweep's runs would vary is shown where this table varies it.
    cols = [c for c in cols if c in table.columns and (c != "cipher" or sealed) and (c != "transport" or carried)
            and (c != "codec" or coded) and (c != "in_flight" or deep) and (c != "scenario" or loaded)
            and (c not in OPTIONAL_KEY or table[c].fillna(OPTIONAL_KEY[c]).ne(OPTIONAL_KEY[c]).any())]
    if "front_status" in table.columns:
        shown = table[table["front_status"].isin([pareto.FRONT, pareto.TIED])]
    else:  # a pareto.csv written before ties were reported
        shown = table[table["on_front"]]
    shown = shown[cols].sort_values([c for c in ("model", "backend", "cipher", "transport", "codec", "scenario",
                                                 "prompt_len", "fault", "placement", "engine", "network", main[0])
                                if c in cols])
    return shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")


