"""The fronts under MLPerf LoadGen's scenarios, and how they differ from the closed loop's.

A session that swept LoadGen scenarios (``--scenario singlestream,offline,server``, and
``closed`` for the suite's own closed loop) holds one summary row per split and scenario. Here
they become one row per split: SingleStream's p90 and MultiStream's p99 latency, Offline's samples
per second and the Server's highest rate within its bound, each with LoadGen's verdict. The
LoadGen front is taken over the objectives the session measured (p90 down, Offline samples/s up,
the Server rate up as a third), and compared, network by network, with the closed loop's front
(median latency down, throughput up): the splits that join or leave the front.

A language model's queries are prompts, timed by token: its objectives are SingleStream's p90 time
to first token and per output token, Offline's tokens/s and the Server's rate within both token
bounds; its closed loop's are the median time to first token and per token, and tokens/s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .. import records, workload
from ..errors import UsageError
from . import pareto
from .keys import CLOSED_LOOP, CONFIG_KEY, KEY_DEFAULTS
from .plotting import plain_log_ticks

FILE = "loadgen_front.csv"
#: Per scenario: (its column in the per-split table, the summary column it comes from, the sense).
OBJECTIVES = {"singlestream": ("singlestream_p90_s", "loadgen_latency_p90_s", "min"),
              "multistream": ("multistream_p99_s", "loadgen_latency_p99_s", "min"),
              "offline": ("offline_samples_per_s", "loadgen_samples_per_s", "max"),
              "server": ("server_qps", "loadgen_server_qps", "max")}
#: A language model's: per scenario, its columns (each from a summary column, with its sense).
TOKEN_OBJECTIVES = {"singlestream": (("singlestream_ttft_p90_s", "loadgen_ttft_p90_s", "min"),
                                     ("singlestream_tpot_p90_s", "loadgen_tpot_p90_s", "min")),
                    "offline": (("offline_tokens_per_s", "loadgen_tokens_per_s", "max"),),
                    "server": (("server_qps", "loadgen_server_qps", "max"),)}
#: The closed loop's figures beside them: (its column here, the summary column, the sense).
CLOSED = (("closed_latency_s", "latency_median_s", "min"),
          ("closed_throughput_imgs_per_s", "throughput_imgs_per_s", "max"))
TOKEN_CLOSED = (("closed_ttft_s", "ttft_median_s", "min"), ("closed_tpot_s", "tpot_median_s", "min"),
                ("closed_tokens_per_s", "tokens_per_s", "max"))
#: The front's objectives, in order of preference: p90 against Offline samples/s, and the Server rate.
FRONT_SCENARIOS = ("singlestream", "offline", "server")
#: One front per model, backend, cipher, transport, codec, depth, network and batch size.
SPLIT_GROUP = [k for k in CONFIG_KEY if k not in ("split_index", "scenario")]


def scenario_objectives(tokens: bool) -> dict[str, tuple[tuple[str, str, str], ...]]:
    """Per scenario, its columns here: an image model's one figure, or a generation's by token."""
    return TOKEN_OBJECTIVES if tokens else {s: (o,) for s, o in OBJECTIVES.items()}


def per_split(table: pd.DataFrame) -> pd.DataFrame:
    """One row per split configuration: each LoadGen scenario's figures and verdict, and the closed
    loop's where the session measured it (empty without any scenario)."""
    if "scenario" not in table.columns or not table["scenario"].ne(CLOSED_LOOP).any():
        return pd.DataFrame()
    tokens = workload.of_table(table).generates
    objectives = scenario_objectives(tokens)
    keys = SPLIT_GROUP + ["split_index"]
    rows: dict[tuple, dict[str, Any]] = {}
    for _, r in table.iterrows():
        key = tuple(r.get(k, KEY_DEFAULTS.get(k)) for k in keys)
        row = rows.setdefault(key, {**dict(zip(keys, key)), "cut": r.get("cut")})
        scenario = r["scenario"]
        if scenario == CLOSED_LOOP:
            row.update({column: r.get(source) for column, source, _ in (TOKEN_CLOSED if tokens else CLOSED)})
        elif scenario in objectives:
            row.update({column: r.get(source) for column, source, _ in objectives[scenario]})
            row[f"{scenario}_result"] = r.get("loadgen_result")
            row["compliance"] = r.get("loadgen_compliance")
            if scenario == "server":
                row["latency_bound_s"] = r.get("loadgen_latency_bound_s")
                if tokens:
                    row.update(ttft_bound_s=r.get("loadgen_ttft_bound_s"), tpot_bound_s=r.get("loadgen_tpot_bound_s"))
    out = pd.DataFrame(list(rows.values()))
    out.attrs["tokens"] = tokens
    return out


def _tokens(split_table: pd.DataFrame) -> bool:
    """Whether a per-split table (built here, or read back from its CSV) is a generation's."""
    return bool(split_table.attrs.get("tokens")) or any(
        c in split_table.columns for c in ("closed_tokens_per_s", "singlestream_ttft_p90_s", "offline_tokens_per_s"))


def front_objectives(split_table: pd.DataFrame) -> dict[str, str]:
    """The LoadGen objectives the session measured, by column: p90, Offline samples/s and the Server
    rate where present (MultiStream's p99 stands in for p90 when SingleStream was not swept)."""
    objectives = scenario_objectives(_tokens(split_table))
    chosen = [s for s in FRONT_SCENARIOS if objectives[s][0][0] in split_table.columns]
    if "singlestream" not in chosen and "multistream" in objectives and \
            objectives["multistream"][0][0] in split_table.columns:
        chosen.insert(0, "multistream")
    return {column: sense for s in chosen for column, _, sense in objectives[s]}


def fronts(table: pd.DataFrame) -> pd.DataFrame:
    """The per-split table with ``on_loadgen_front`` (and ``on_closed_front`` where the closed loop
    was measured too)."""
    split_table = per_split(table)
    if split_table.empty:
        return split_table
    objectives = front_objectives(split_table)
    groups = [c for c in SPLIT_GROUP if c in split_table.columns]
    split_table["on_loadgen_front"] = pareto.mark_front(split_table, objectives, groups)["on_front"] if objectives \
        else False
    closed = {column: sense for column, _, sense in (TOKEN_CLOSED if _tokens(split_table) else CLOSED)
              if column in split_table.columns}
    if closed:
        split_table["on_closed_front"] = pareto.mark_front(split_table, closed, groups)["on_front"]
    split_table.attrs["objectives"] = objectives
    return split_table


def read_predictions(path: Path) -> pd.DataFrame:
    """The Server columns of ``paretopipe predict --latency-bound-ms B --out DIR``'s predictions.csv."""
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--predictions {path}: not a readable CSV ({str(exc).splitlines()[0][:120]})")
    if "predicted_server_qps" not in table.columns:
        raise UsageError(f"--predictions {path}: no predicted_server_qps column; give the predictions.csv of "
                         f"paretopipe predict --latency-bound-ms B --out DIR")
    return table


def with_predictions(marked: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """Each split's predicted Server rate and capacity beside the measured one (by network and
    block split, and a language model's prompt length)."""
    cols = ["predicted_server_qps", "predicted_server_capacity_qps", "predicted_server_bottleneck"]
    on = ["network", "_k"] + (["prompt_len"] if "prompt_len" in predicted.columns and "prompt_len" in marked.columns
                              and marked["prompt_len"].notna().all() else [])
    pred = predicted.assign(_k=predicted["split"].astype(str))
    if "prompt_len" in on:
        pred = pred.assign(prompt_len=pred["prompt_len"].astype(int))
        marked = marked.assign(prompt_len=marked["prompt_len"].astype(int))
    out = marked.assign(_k=marked["split_index"].astype(str)).merge(pred[on + cols], on=on, how="left").drop(columns="_k")
    out.attrs = marked.attrs
    return out


def write(table: pd.DataFrame, out: Path, predicted: pd.DataFrame | None = None, plt: Any = None,
          fmt: str = "png") -> pd.DataFrame:
    """``loadgen_front.csv`` in the report folder, with ``predicted``'s Server rates where given,
    and its figure (nothing when the session swept no scenario)."""
    marked = fronts(table)
    if marked.empty:
        return marked
    if predicted is not None:
        marked = with_predictions(marked, predicted)
    records.atomic_write_csv(out / FILE, marked.to_dict("records"), list(marked.columns))
    if plt is not None:
        figure(marked, plt, out / f"loadgen_front.{fmt}")
    return marked


def figure(marked: pd.DataFrame, plt: Any, path: Path) -> Path | None:
    """SingleStream p90 against Offline samples/s per network (a generation's: p90 time to first
    token against Offline tokens/s), each split coloured by its Server rate (the third objective),
    the front's splits labelled and joined."""
    tokens = _tokens(marked)
    x, y = ("singlestream_ttft_p90_s", "offline_tokens_per_s") if tokens else ("singlestream_p90_s",
                                                                               "offline_samples_per_s")
    if not {x, y} <= set(marked.columns):
        return None
    networks = list(dict.fromkeys(marked["network"]))
    fig, axes = plt.subplots(1, len(networks), figsize=(5.5 * len(networks), 4.5), squeeze=False)
    server = "server_qps" in marked.columns and marked["server_qps"].notna().any()
    for ax, network in zip(axes[0], networks):
        g = marked[marked["network"] == network]
        colour = g["server_qps"].fillna(0) if server else "#0072B2"
        points = ax.scatter(g[x] * 1e3, g[y], c=colour, cmap="viridis", s=40, edgecolors="black", linewidths=0.4)
        front = g[g["on_loadgen_front"].astype(bool)].sort_values(x)
        ax.plot(front[x] * 1e3, front[y], color="black", linewidth=1)
        for k, fx, fy in zip(front["split_index"], front[x], front[y]):
            ax.annotate(f"k={k}", (fx * 1e3, fy), fontsize=8, xytext=(3, 3), textcoords="offset points")
        if g[x].max() > 10 * g[x].min() > 0:  # a narrower range reads better on a linear axis
            ax.set_xscale("log")
            plain_log_ticks(ax.xaxis)
        ax.set(title=f"{network}: LoadGen front", ylabel="Offline tokens/s" if tokens else "Offline samples/s",
               xlabel="SingleStream p90 time to first token (ms)" if tokens else "SingleStream p90 latency (ms)")
        if server:
            fig.colorbar(points, ax=ax, label="Server rate within the bound (q/s; 0: none)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _splits(frame: pd.DataFrame) -> str:
    return ", ".join(str(s) for s in frame["split_index"]) or "none"


def _rate(r: Any) -> str:
    """One split's measured Server rate, and its prediction where the table has one."""
    measured = f"{r.server_qps:.1f}" if pd.notna(r.server_qps) else "none"
    predicted = getattr(r, "predicted_server_qps", None)
    return f"k={r.split_index} {measured}" + (f" (predicted {predicted:.1f})" if predicted is not None and
                                              pd.notna(predicted) else "")


def _bound_text(g: pd.DataFrame) -> str:
    """The Server's bound in words: on the p99 latency, or a generation's on its tokens."""
    if "ttft_bound_s" in g.columns and g["ttft_bound_s"].notna().any():
        return (f" within p99 TTFT {g['ttft_bound_s'].dropna().iloc[0] * 1e3:g} ms and TPOT "
                f"{g['tpot_bound_s'].dropna().iloc[0] * 1e3:g} ms")
    bound = g["latency_bound_s"].dropna()
    return f" within p99 {bound.iloc[0] * 1e3:g} ms" if len(bound) else ""


def describe(marked: pd.DataFrame) -> list[str]:
    """Lines per network: the LoadGen front, each Server rate, and which splits change place
    against the closed loop's front."""
    if marked.empty:
        return []
    lines = []
    objectives = list(marked.attrs.get("objectives") or front_objectives(marked))
    compliance = marked["compliance"].dropna().iloc[0] if "compliance" in marked and marked["compliance"].notna().any() \
        else "not MLPerf-compliant"
    lines.append(f"LoadGen fronts over {', '.join(objectives)} ({compliance}):")
    for network, g in marked.groupby("network", sort=False):
        on = g[g["on_loadgen_front"].astype(bool)]
        lines.append(f"  {network}: front {_splits(on)}")
        if "server_qps" in g.columns:
            rates = ", ".join(_rate(r) for r in g.itertuples())
            lines.append(f"    server rate (q/s{_bound_text(g)}): {rates}")
        if "on_closed_front" in g.columns:
            closed = g[g["on_closed_front"].astype(bool)]
            joined = g[g["on_loadgen_front"].astype(bool) & ~g["on_closed_front"].astype(bool)]
            left = g[~g["on_loadgen_front"].astype(bool) & g["on_closed_front"].astype(bool)]
            lines.append(f"    closed-loop front {_splits(closed)}; under LoadGen joined: {_splits(joined)}; "
                         f"left: {_splits(left)}")
    return lines
