"""Predictions from device profiles: every split under given network conditions, and the optimal
split versus link rate. Every figure here is modelled (``predicted_*``), never measured."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..analysis import pareto
from ..errors import UsageError
from ..loadgen import queueing
from ..units import parse_rate
from .costmodel import LinkModel, chain_terms
from .device_profile import DeviceProfile
from ..analysis.plotting import PALETTE, pyplot, save_figure

log = logging.getLogger("paretopipe.predict")

PREDICTED = {"predicted_latency_s": "min", "predicted_throughput_imgs_per_s": "max"}


def base_transport(profiles: Sequence[DeviceProfile], base_rate: str | None) -> dict[str, Any]:
    """The transport beneath shaped links: ``--base-rate``, or this host's loopback when every
    profile was taken on one host (stages co-located, as in a local sweep), else unlimited."""
    if base_rate:
        if base_rate == "loopback":
            return profiles[0].doc.get("loopback") or {}
        return {"fixed_s": 0.0, "bytes_per_s": parse_rate(base_rate) / 8}
    hosts = {p.doc.get("manifest", {}).get("hostname") for p in profiles}
    if len(hosts) == 1:
        return profiles[0].doc.get("loopback") or {}
    log.info("profiles come from different hosts: the network beneath the shaping is taken as unlimited; "
             "give --base-rate (e.g. 940mbit for gigabit Ethernet) to model it")
    return {}


def split_positions(profile: DeviceProfile, fine: bool) -> list[tuple[str, int]]:
    """(label, boundary index) of every block split k = 0..K, or of every fine cut."""
    if fine:
        return [(name, i) for i, name in enumerate(profile.boundaries)]
    return [(str(k), b) for k, b in sorted(profile.blocks.items())]


#: The predicted column of each objective (analysis.objectives names them for measured sessions).
PREDICTED_COLUMNS = {"latency": ("predicted_latency_s", "min"),
                     "throughput": ("predicted_throughput_imgs_per_s", "max"),
                     "energy": ("predicted_energy_modelled_per_image_j", "min"),
                     "memory": ("predicted_memory_bytes", "min")}


def predicted_objectives(names: str | None, table: pd.DataFrame) -> dict[str, str]:
    """``--objectives`` as predicted columns: memory from the profiles' parameter and activation
    bytes, energy modelled from each device's declared core power (``--power-core-w``)."""
    out = {}
    for name in (names or "latency,throughput").split(","):
        name = name.strip()
        stage = name.rpartition("_stage")
        if name in PREDICTED_COLUMNS:
            column, sense = PREDICTED_COLUMNS[name]
        elif stage[0] == "memory" and stage[2].isdigit():
            column, sense = f"predicted_memory_stage{stage[2]}_bytes", "min"
        else:
            raise UsageError(f"--objectives {name!r}: predict knows latency, throughput, energy, memory, memory_stageN")
        if column not in table.columns or table[column].isna().all():
            why = ("give --power-core-w, the watts one busy core adds on each device" if name == "energy" else
                   "the device profiles carry no parameter bytes: profile again with this version")
            raise UsageError(f"--objectives {name}: no predicted {column}; {why}")
        out[column] = sense
    return out


def predict_splits(profiles: Sequence[DeviceProfile], link: LinkModel, batch_size: int, codec: str,
                   fine: bool = False, back: LinkModel | None = None, objectives: str | None = None,
                   power_core_w: Sequence[float | None] | None = None,
                   latency_bound_s: float | None = None) -> pd.DataFrame:
    """One row per split of a 2-device chain: every term, the latency, the throughput, memory and
    (with ``power_core_w``) modelled energy, and the front over ``objectives``. ``link`` is the way
    there (up), ``back`` the way back (down; default the same). With ``latency_bound_s``: the
    MLPerf Server rate each split should sustain with its 99th percentile within the bound, from
    the queueing at its bottleneck (paretopipe.loadgen.queueing; queries of one sample)."""
    rows = []
    for label, boundary in split_positions(profiles[0], fine):
        terms = chain_terms(profiles, [link], [boundary], batch_size, codec, [back or link])
        row = {"network": link.name, "split": label, "cut": profiles[0].boundaries[boundary],
               "boundary": boundary, "batch_size": batch_size, **terms.as_row()}
        if power_core_w:
            row["predicted_energy_modelled_per_image_j"] = terms.energy_modelled_per_image_j(power_core_w)
        if latency_bound_s is not None:
            one = chain_terms(profiles, [link], [boundary], 1, codec, [back or link])
            row.update(queueing.predicted_columns(one, latency_bound_s))
        rows.append(row)
    table = pd.DataFrame(rows)
    return pareto.mark_front(table, predicted_objectives(objectives, table), by=["network"])


def rate_map(profiles: Sequence[DeviceProfile], link: LinkModel, rates_bps: Sequence[float], batch_size: int,
             codec: str, fine: bool = False, back: LinkModel | None = None) -> pd.DataFrame:
    """For each rate (both directions): the latency-optimal and the throughput-optimal split, and their values."""
    rows = []
    for rate in rates_bps:
        table = predict_splits(profiles, link.with_rate(rate), batch_size, codec, fine,
                               (back or link).with_rate(rate))
        lat = table.loc[table["predicted_latency_s"].idxmin()]
        thr = table.loc[table["predicted_throughput_imgs_per_s"].idxmax()]
        rows.append({"rate_mbit_per_s": rate / 1e6, "best_latency_split": lat["split"],
                     "best_latency_s": lat["predicted_latency_s"], "best_throughput_split": thr["split"],
                     "best_throughput_imgs_per_s": thr["predicted_throughput_imgs_per_s"],
                     "front_splits": " ".join(table.loc[table["on_front"], "split"])})
    return pd.DataFrame(rows)


def parse_rate_range(text: str, points: int) -> np.ndarray:
    """``1mbit..1gbit`` -> ``points`` rates, log-spaced, in bit/s."""
    lo, sep, hi = text.partition("..")
    if not sep:
        raise UsageError(f"--sweep-rate {text!r}: give a range like 1mbit..1gbit")
    a, b = parse_rate(lo), parse_rate(hi)
    if not a or not b or a >= b:
        raise UsageError(f"--sweep-rate {text!r}: the range must go from a lower to a higher positive rate")
    if points < 2:
        raise UsageError("--sweep-points must be at least 2")
    return np.geomspace(a, b, points)


def rate_ranges(df: pd.DataFrame, column: str) -> list[tuple[float, float, str]]:
    """Consecutive rates with the same optimal split, as (from, to, split)."""
    out: list[tuple[float, float, str]] = []
    for rate, best in zip(df["rate_mbit_per_s"], df[column]):
        if out and out[-1][2] == best:
            out[-1] = (out[-1][0], rate, best)
        else:
            out.append((rate, rate, best))
    return out


def plot_rate_map(df: pd.DataFrame, path: Path, title: str, split_order: Sequence[str]) -> Path:
    plt = pyplot()

    pos = {s: i for i, s in enumerate(split_order)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for column, label, colour, style in (("best_latency_split", "latency-optimal split", PALETTE[0], "-"),
                                         ("best_throughput_split", "throughput-optimal split", PALETTE[3], "--")):
        top.step(df["rate_mbit_per_s"], [pos[s] for s in df[column]], where="mid", color=colour, ls=style,
                 lw=2, label=label)
    used = sorted({pos[s] for c in ("best_latency_split", "best_throughput_split") for s in df[c]})
    names = {0: " (all on device 2)", len(split_order) - 1: " (all on device 1)"}
    top.set_yticks(used, [split_order[i] + names.get(i, "") for i in used])
    top.set_ylabel("split (k: first k blocks on device 1)")
    top.set_title(title)
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=8)
    bottom.plot(df["rate_mbit_per_s"], df["best_latency_s"] * 1e3, color=PALETTE[0], label="best latency (ms)")
    bottom.set_ylabel("predicted latency (ms)")
    twin = bottom.twinx()
    twin.plot(df["rate_mbit_per_s"], df["best_throughput_imgs_per_s"], color=PALETTE[3], ls="--",
              label="best throughput (img/s)")
    twin.set_ylabel("predicted throughput (images/s)")
    bottom.set_xscale("log")
    bottom.set_xlabel("link rate (Mbit/s, log scale)")
    bottom.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def engines_front(sets: Sequence[Sequence[DeviceProfile]], link: LinkModel, batch_size: int, codec: str,
                  back: LinkModel | None = None) -> pd.DataFrame:
    """Every split of each set of profiles (one set per engine: ``profile --engine``) on one
    network, the set's engine label in ``engine`` and one front over them all (``on_front``): which
    engine and split win there."""
    tables = []
    for profiles in sets:
        names = [p.engine for p in profiles]
        label = "+".join(names) if len(set(names)) > 1 else names[0]
        tables.append(predict_splits(profiles, link, batch_size, codec, back=back).assign(engine=label))
    table = pd.concat(tables, ignore_index=True).drop(columns=["on_front"])
    if table["engine"].nunique() != len(sets):
        raise UsageError(f"--device-profiles: {len(sets)} sets of profiles but {table['engine'].nunique()} engines; "
                         f"give one set per engine (profile each device with --engine ENGINE)")
    return pareto.mark_front(table, predicted_objectives(None, table), by=["network"])
