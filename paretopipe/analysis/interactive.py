"""``report.html``: the session's fronts in one self-contained page (plotly, with plotly.js inside
the file, so nothing is fetched when it is viewed).

One figure per panel (model, backend, cipher, batch size) over the first two objectives, one trace
per network and status (front, tied, dominated) with the front drawn as a line where the
objectives are latency and throughput; a menu shows one network or all. Hovering a point shows its
split and cut, every objective with its 95% interval, where its time goes (the breakdown's parts)
and its energy and memory. With three or more objectives a scatter matrix of every pair follows.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from .objectives import Objective
from .plotting import PALETTE, breakdown_parts
from .keys import PANEL_KEY, panel_names
from .. import records

#: Energy and memory columns shown on hover when a session has them.
_RESOURCE_HOVER = (("energy_per_image_j", "energy/image (measured)", "J"),
                   ("energy_modelled_per_image_j", "energy/image (modelled)", "J"),
                   ("memory_model_bytes", "memory: largest stage's parameters + activation", "B"),
                   ("memory_peak_bytes", "peak RSS (largest stage process)", "B"),
                   ("stage1_peak_rss_bytes", "stage 1 peak memory", "B"),
                   ("stage2_peak_rss_bytes", "stage 2 peak memory", "B"))
_STATUS_SYMBOL = {"front": "circle", "tied": "circle-open", "dominated": "circle"}


def _fmt(value: Any, unit: str = "") -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(v):
        return "n/a"
    if unit == "B":
        for u in ("B", "KiB", "MiB", "GiB"):
            if abs(v) < 1024 or u == "GiB":
                return f"{v:.0f} {u}" if u == "B" else f"{v:.1f} {u}"
            v /= 1024
    return f"{v:.4g}{(' ' + unit) if unit else ''}"


def hover_text(row: pd.Series, objectives: Sequence[Objective]) -> str:
    """One point's hover box: its split and cut, each objective with its interval, the time
    breakdown (ms per batch) and its energy and memory."""
    lines = [f"<b>k={html.escape(str(row['split_index']))}</b> ({html.escape(str(row.get('cut', '')))})",
             f"network {html.escape(str(row['network']))}, {html.escape(str(row.get('front_status', '')))}"]
    for o in objectives:
        ci = ""
        if o.low and o.high and o.low in row and o.high in row:
            ci = f" [{_fmt(row[o.low])}, {_fmt(row[o.high])}]"
        lines.append(f"{html.escape(o.label)}: {_fmt(row.get(o.column))}{ci}")
    parts = breakdown_parts(pd.DataFrame([row]))
    lines.append("time per batch: " + ", ".join(f"{label.split(' (')[0]} {v[0] * 1e3:.2f} ms"
                                                  for label, _, v in parts if v[0] > 0))
    for col, label, unit in _RESOURCE_HOVER:
        if col in row and pd.notna(row[col]):
            lines.append(f"{label}: {_fmt(row[col], unit)}")
    return "<br>".join(lines)


def _panel_figure(panel: pd.DataFrame, objectives: Sequence[Objective], title: str):
    import plotly.graph_objects as go

    x, y = objectives[0], objectives[1]
    fig = go.Figure()
    networks = list(dict.fromkeys(panel["network"]))
    draw_line = {x.name, y.name} == {"latency", "throughput"} and len(objectives) == 2
    traces_of: dict[str, list[int]] = {n: [] for n in networks}
    for i, network in enumerate(networks):
        colour = PALETTE[i % len(PALETTE)]
        rows = panel[panel["network"] == network]
        for status in ("front", "tied", "dominated"):
            pts = rows[rows.get("front_status", pd.Series("", index=rows.index)) == status]
            if pts.empty:
                continue
            if status == "front":
                pts = pts.sort_values(x.column)
            error = {}
            for axis, o in (("error_x", x), ("error_y", y)):
                if o.low in pts and o.high in pts:
                    error[axis] = {"type": "data", "symmetric": False, "thickness": 1, "width": 2,
                                   "array": (pts[o.high] - pts[o.column]).clip(lower=0).fillna(0).tolist(),
                                   "arrayminus": (pts[o.column] - pts[o.low]).clip(lower=0).fillna(0).tolist()}
            fig.add_trace(go.Scatter(
                x=pts[x.column].tolist(), y=pts[y.column].tolist(),
                mode="markers+text",
                text=[f"k={k}" for k in pts["split_index"]], textposition="top right", textfont={"size": 9},
                name=f"{network} {status}", legendgroup=network,
                marker={"color": colour, "size": 9 if status == "front" else 7,
                        "symbol": _STATUS_SYMBOL[status], "opacity": 1.0 if status != "dominated" else 0.45},
                line={"color": colour}, hovertemplate="%{customdata}<extra></extra>",
                customdata=[hover_text(r, objectives) for _, r in pts.iterrows()], **error))
            traces_of[network].append(len(fig.data) - 1)
        line = rows[rows["on_front"].astype(bool)].sort_values(x.column) if "on_front" in rows else rows.iloc[0:0]
        if draw_line and len(line) >= 2:  # the strict front's line, as the static figures draw it
            fig.add_trace(go.Scatter(x=line[x.column].tolist(), y=line[y.column].tolist(), mode="lines",
                                     line={"color": colour}, name=f"{network} front line", legendgroup=network,
                                     showlegend=False, hoverinfo="skip"))
            traces_of[network].append(len(fig.data) - 1)
    total = len(fig.data)
    buttons = [{"label": "all networks", "method": "update", "args": [{"visible": [True] * total}]}]
    for network, ix in traces_of.items():
        buttons.append({"label": network, "method": "update",
                        "args": [{"visible": [j in ix for j in range(total)]}]})
    fig.update_layout(title=title, template="plotly_white", height=560, hovermode="closest",
                      xaxis_title=x.label, yaxis_title=y.label,
                      updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right",
                                    "y": 1.12, "yanchor": "top"}])
    if x.name == "latency":
        fig.update_xaxes(type="log")
    return fig


def _matrix_figure(panel: pd.DataFrame, objectives: Sequence[Objective], title: str):
    import plotly.graph_objects as go

    networks = list(dict.fromkeys(panel["network"]))
    dims = [{"label": o.label.split(" (")[0], "values": panel[o.column].tolist()} for o in objectives]
    colours = [PALETTE[networks.index(n) % len(PALETTE)] for n in panel["network"]]
    on = panel.get("front_status", pd.Series("", index=panel.index)).eq("front").tolist()
    fig = go.Figure(go.Splom(dimensions=dims, showupperhalf=False, diagonal_visible=False,
                             text=[f"k={k} {n}" for k, n in zip(panel["split_index"], panel["network"])],
                             customdata=[hover_text(r, objectives) for _, r in panel.iterrows()],
                             hovertemplate="%{customdata}<extra></extra>",
                             marker={"color": colours, "size": [10 if f else 6 for f in on],
                                     "line": {"width": [1.5 if f else 0 for f in on], "color": "black"}}))
    fig.update_layout(title=f"{title}: every pair of objectives (front points outlined)", template="plotly_white",
                      height=260 * len(objectives), dragmode="select")
    return fig


def write_html(table: pd.DataFrame, objectives: Sequence[Objective], path: Path, extra: str = "") -> Path:
    """The report page of ``table`` (pareto.csv's rows) over ``objectives``, then ``extra`` (HTML
    sections of tables): plotly.js is embedded once, in the page's head, so it works offline and
    from a file."""
    import plotly.io as pio


    sections = []
    depths = table["in_flight"].nunique() > 1
    for key, panel in table.groupby(PANEL_KEY):
        title, stem = panel_names(key, depths)
        figures = [_panel_figure(panel, objectives, f"Pareto fronts: {title}")]
        if len(objectives) >= 3:
            figures.append(_matrix_figure(panel, objectives, title))
        for i, fig in enumerate(figures):
            sections.append(pio.to_html(fig, include_plotlyjs=False, full_html=False,
                                        div_id=re.sub(r"[^A-Za-z0-9_-]", "_", f"{stem}-{i}")))
    from plotly.offline import get_plotlyjs

    names = ", ".join(o.label for o in objectives)
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>ParetoPipe report</title>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body style=\"font-family: sans-serif\">"
            f"<h1>ParetoPipe report</h1><p>Objectives: {html.escape(names)}. Front points are filled and joined, tied "
            "points (within the 95% intervals of a front point on every objective) are open circles, dominated "
            "points are faint. Hover a point for its split, intervals, time breakdown, energy and memory; the menu "
            "shows one network.</p>" + "".join(sections) + extra + "</body></html>")
    return records.atomic_write_text(path, page)
