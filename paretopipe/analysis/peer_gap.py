"""llama.cpp beside our engine, where a session measured both on a language model: per split and
network, what crosses per token each way and in how many round trips, the time per token the
cost model gives llama.cpp from those counts, and how far that is from what was measured; and
how often the two engines' greedy tokens agree.

The cost model: a token costs llama.cpp its compute, one link round trip per exchange, and its
bytes at the link's rate each way::

    TPOT = compute + RTT x round_trips_per_token + up_bytes / up_rate + down_bytes / down_rate

``compute`` is the time per token measured at the same split on the session's unshaped network
(no delay, no rate: lan), where the link costs nothing; the counts are the relay's, measured on the
network being predicted. With several servers (a plan) ``up_bytes`` is what went up to all of them
(``hop<j>_bytes_per_token``: llama.cpp's client sends each its share in turn), and the round trips
are a server each. The error is (predicted - measured) / measured.

Agreement: each llama.cpp run's tokens against our engine's on the same prompts (the same seeded
ids: the same prompt length and seed, which is the run's index; greedy decoding): the share of each
stream's tokens before the first that differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .. import engines, records
from ..llm import summary as llm_summary
from .keys import split_sort_key
from .plotting import PALETTE, save_figure
from .session import Session

PEER_FILE = "peer_llamacpp.csv"
COLUMNS = ["model", "prompt_len", "network", "split_index", "engine", "ttft_median_s", "tpot_median_s",
           "bytes_per_token", "down_bytes_per_token", "round_trips_per_token", "server_tpot_median_s"]


def link_terms(conditions: dict[str, Any] | None) -> tuple[float, float | None, float | None]:
    """(round trip in s, up and down rates in bytes/s, None unlimited) of a record's conditions;
    none applied is an unshaped link."""
    return llm_summary.link_terms({"conditions": conditions}) or (0.0, None, None)


def predicted_tpot(compute_s: float, rtt_s: float, round_trips: float, up_bytes: float, down_bytes: float,
                   up_rate: float | None, down_rate: float | None) -> float:
    """The cost model's time per token (module docstring)."""
    return compute_s + rtt_s * round_trips + (up_bytes / up_rate if up_rate else 0.0) + \
        (down_bytes / down_rate if down_rate else 0.0)


def _conditions(session: Session, runs: pd.DataFrame) -> dict[str, dict[str, Any] | None]:
    """Each network's conditions, from the first readable record that ran on it."""
    out: dict[str, dict[str, Any] | None] = {}
    for network, rows in runs.groupby("network", sort=False):
        for path in rows["json"].dropna():
            rec = session.read_run(session.path / str(path))
            if rec is not None:
                out[str(network)] = (rec.get("manifest", {}).get("link") or {}).get("conditions")
                break
    return out


def gap_table(configs: pd.DataFrame, conditions: dict[str, dict[str, Any] | None]) -> pd.DataFrame:
    """Both engines' rows per split and network, and for llama.cpp's the cost model's TPOT and its
    error; empty where the table has no llama.cpp row."""
    if "engine" not in configs.columns or not (configs["engine"] == engines.LLAMACPP).any():
        return pd.DataFrame(columns=COLUMNS)
    table = configs[configs["engine"].isin([engines.TORCH, engines.LLAMACPP])]
    hops = [c for c in table.columns if c.startswith("hop") and c.endswith("_bytes_per_token")]
    up_total = table[hops].sum(axis=1, min_count=1) if hops else table["bytes_per_token"]
    table = table[[c for c in COLUMNS if c in table.columns]].copy()
    table["up_bytes_per_token"] = up_total.fillna(table["bytes_per_token"])
    terms = {n: link_terms(c) for n, c in conditions.items()}
    unshaped = [n for n, (rtt, up, down) in terms.items() if rtt == 0 and up is None and down is None]
    predicted, error = [], []
    for _, row in table.iterrows():
        base = table[(table["engine"] == row["engine"]) & (table["split_index"] == row["split_index"])
                     & (table["prompt_len"] == row["prompt_len"]) & table["network"].isin(unshaped)]
        if row["engine"] != engines.LLAMACPP or base.empty or row["network"] not in terms:
            predicted.append(None)
            error.append(None)
            continue
        value = predicted_tpot(float(base["tpot_median_s"].iloc[0]), terms[row["network"]][0],
                               float(row["round_trips_per_token"]), float(row["up_bytes_per_token"]),
                               float(row["down_bytes_per_token"]), *terms[row["network"]][1:])
        predicted.append(value)
        error.append((value - row["tpot_median_s"]) / row["tpot_median_s"])
    table["tpot_predicted_s"], table["tpot_prediction_error"] = predicted, error
    return table.sort_values(["network", "split_index", "engine"],
                             key=lambda c: c.map(split_sort_key) if c.name == "split_index" else c)


def agreement(session: Session, runs: pd.DataFrame) -> pd.DataFrame:
    """Per llama.cpp run: the share of its greedy tokens that match our engine's on the same
    prompts (the same prompt length and seed: a run's seeded prompts) before the first that differs
    (module docstring)."""
    def tokens(rows: pd.DataFrame) -> list[tuple[Any, tuple, list[list[int]]]]:
        out = []
        for _, row in rows.iterrows():
            rec = session.read_run(session.path / str(row["json"])) if pd.notna(row.get("json")) else None
            if rec and rec.get("generation") and rec["config"]["generation"]["temperature"] == 0:
                out.append((row, (row["prompt_len"], rec["config"].get("seed")), rec["generation"]["tokens"]))
        return out
    ours = {key: t for _, key, t in tokens(runs[runs["engine"] == engines.TORCH])}
    rows = []
    for row, key, theirs in tokens(runs[runs["engine"] == engines.LLAMACPP]):
        reference = ours.get(key)
        if reference is None:
            continue
        shares = [_prefix(a, b) / max(1, len(b)) for a, b in zip(theirs, reference)]
        rows.append({"network": row["network"], "split_index": row["split_index"], "run": row["run"],
                     "tokens_agree_with_torch": sum(shares) / len(shares) if shares else None})
    return pd.DataFrame(rows)


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def write(session: Session, out: Path, plt: Any, fmt: str = "png") -> pd.DataFrame:
    """``peer_llamacpp.csv`` and the bytes and round trips figure where the session measured
    llama.cpp; returns the table (empty otherwise)."""
    configs, runs = session.configs(), session.runs()
    if "engine" not in configs.columns or not (configs["engine"] == engines.LLAMACPP).any():
        return pd.DataFrame()
    table = gap_table(configs, _conditions(session, runs))
    agree = agreement(session, runs)
    if not agree.empty:
        mean = agree.groupby(["network", "split_index"])["tokens_agree_with_torch"].mean().rename(
            "tokens_agree_with_torch").reset_index()
        table = table.merge(mean.assign(engine=engines.LLAMACPP), on=["network", "split_index", "engine"],
                            how="left")
    records.atomic_write_csv(out / PEER_FILE, table.to_dict("records"), list(table.columns))
    _figure(plt, table, out, fmt)
    return table


def _figure(plt: Any, table: pd.DataFrame, out: Path, fmt: str) -> None:
    """Per split, each engine's bytes per token each way and its round trips per token."""
    rows = table.drop_duplicates(["split_index", "engine"])
    splits = sorted(rows["split_index"].unique(), key=split_sort_key)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.2
    for i, (engine, part) in enumerate(rows.groupby("engine", sort=True)):
        part = part.set_index("split_index").reindex(splits)
        xs = [j + (i - 0.5) * 2 * width for j in range(len(splits))]
        left.bar([x - width / 2 for x in xs], part["bytes_per_token"], width, color=PALETTE[2 * i],
                 label=f"{engine}: up")
        left.bar([x + width / 2 for x in xs], part["down_bytes_per_token"], width, color=PALETTE[2 * i + 1],
                 label=f"{engine}: down")
        right.bar(xs, part["round_trips_per_token"], 2 * width, color=PALETTE[2 * i], label=engine)
    for ax, label in ((left, "bytes per token (log scale)"), (right, "round trips per token")):
        ax.set_xticks(range(len(splits)), [str(k) for k in splits])
        ax.set_xlabel("split (blocks on stage 1)")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    left.set_yscale("symlog", linthresh=10)
    most = pd.concat([rows["bytes_per_token"], rows["down_bytes_per_token"]]).max()
    left.set_ylim(0, 3 * most if pd.notna(most) and most > 0 else 10)
    fig.suptitle("What crosses the link per generated token: our engine against llama.cpp's RPC")
    save_figure(fig, out / f"peer_llamacpp_bytes.{fmt}")
