"""What each extra device buys, as measured: the report's device table (report/devices.csv and a
section of report.html).

A session swept over ``--placements`` (or sessions of plans with different numbers of stages)
holds configurations on 2, 3, ... devices. Per objective, the best configuration on k devices is
set against the best on k - 1: its ratio, and whether the extra device bought a ``gain``, a
``loss`` or ``none``. Users of exo and distributed-llama report that an extra node made generation
slower; this table says so, or not, from the session's own runs. ``predict --subsets`` prints the
same table from device profiles (:mod:`paretopipe.predict.subsets`), by the same
:func:`marginal_gains`.
"""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path
from typing import Any, Protocol, Sequence

import pandas as pd

from .. import records
from ..splitspec import Split
from .keys import CONFIG_KEY, NO_PLACEMENT, OPTIONAL_KEY, placement_devices
from .objectives import Objective

FILE = "devices.csv"


class Placed(Protocol):
    """A placement with its best figure per objective: the devices (indices, the source first)."""

    devices: tuple[int, ...]

    def figure(self, objective: str) -> tuple[float, tuple[Any, ...]]: ...


@dataclasses.dataclass(frozen=True)
class Measured:
    """One placement's best measured configuration per objective: (value, its split) each."""

    devices: tuple[int, ...]
    figures: dict[str, tuple[float, tuple[Any, ...]]]

    def figure(self, objective: str) -> tuple[float, tuple[Any, ...]]:
        return self.figures[objective]


def marginal_gains(placed: Sequence[Placed], names: Sequence[str], senses: dict[str, str]) -> list[dict[str, Any]]:
    """Per objective (``senses``: its min or max) and number of devices: the best placement and its
    figure, its ratio to the best with one device fewer (a time: below 1 is a gain; a rate: above 1
    is), and whether the extra device bought a ``gain``, a ``loss`` or ``none``."""
    rows: list[dict[str, Any]] = []
    for objective, sense in senses.items():
        previous = None
        for k in sorted({len(p.devices) for p in placed}):
            pick = min if sense == "min" else max
            best = pick((p for p in placed if len(p.devices) == k), key=lambda p: p.figure(objective)[0])
            value, cuts = best.figure(objective)
            rows.append({"objective": objective, "devices": k, "placement": " -> ".join(names[i] for i in best.devices),
                         "value": value, "cuts": list(cuts), "vs_one_fewer": value / previous if previous else None,
                         "gain": _gain(value, previous, sense)})
            previous = value
    return rows


def _gain(value: float, previous: float | None, sense: str) -> str | None:
    if previous is None:
        return None
    if abs(value - previous) <= 1e-9 * max(abs(previous), 1e-12):
        return "none"
    return "gain" if (value < previous) == (sense == "min") else "loss"


def row_devices(row: dict[str, Any]) -> tuple[int, ...]:
    """The hosts a configuration ran on: its placement's, else the first ones, one per stage."""
    placed = placement_devices(row.get("placement", NO_PLACEMENT))
    return placed if placed is not None else tuple(range(Split.of(row["split_index"]).stages))


def device_table(configs: pd.DataFrame, objectives: Sequence[Objective], hosts: Sequence[str]) -> pd.DataFrame:
    """Per setting (every key column but the split and the placement) and objective: the best
    measured configuration on each number of devices and what the extra device bought; empty
    where the session ran one number of devices only. ``hosts``: the testbed's addresses in .env's
    order (a placement names them)."""
    done = configs[configs["status"].eq("complete")] if "status" in configs.columns else configs
    chosen = [o for o in objectives if o.column in done.columns]
    if done.empty or not chosen:
        return pd.DataFrame()
    setting = [c for c in CONFIG_KEY if c in done.columns and c not in ("split_index", "placement") and not (
        c in OPTIONAL_KEY and done[c].fillna(OPTIONAL_KEY[c]).eq(OPTIONAL_KEY[c]).all())]
    out: list[dict[str, Any]] = []
    for key, group in done.groupby(setting, dropna=False, sort=True):
        placed = _best_per_placement(group.to_dict("records"), chosen)
        if len({len(p.devices) for p in placed}) < 2:
            continue
        used = max(max(p.devices) for p in placed) + 1
        names = [hosts[i] if i < len(hosts) else f"host {i + 1}" for i in range(used)]
        values = dict(zip(setting, key if isinstance(key, tuple) else (key,)))
        out += [{**values, **row, "cuts": ",".join(map(str, row["cuts"]))}
                for row in marginal_gains(placed, names, {o.name: o.sense for o in chosen})]
    return pd.DataFrame(out)


def _best_per_placement(rows: list[dict[str, Any]], objectives: Sequence[Objective]) -> list[Measured]:
    by_devices: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for row in rows:
        by_devices.setdefault(row_devices(row), []).append(row)
    out = []
    for devices, members in sorted(by_devices.items()):
        figures = {}
        for o in objectives:
            usable = [m for m in members if m.get(o.column) == m.get(o.column) and m.get(o.column) is not None]
            if usable:
                pick = min if o.sense == "min" else max
                best = pick(usable, key=lambda m: float(m[o.column]))
                figures[o.name] = (float(best[o.column]), (best["split_index"],))
        if len(figures) == len(objectives):
            out.append(Measured(devices, figures))
    return out


def write(configs: pd.DataFrame, objectives: Sequence[Objective], out: Path, hosts: Sequence[str]) -> pd.DataFrame:
    """devices.csv in ``out`` (nothing where one number of devices ran); returns the table."""
    table = device_table(configs, objectives, hosts)
    if not table.empty:
        records.atomic_write_csv(out / FILE, table.to_dict("records"), list(table.columns))
    return table


def html_section(table: pd.DataFrame, labels: dict[str, str]) -> str:
    """report.html's device section (empty where one number of devices ran); ``labels``: each
    objective's axis label by its name."""
    if table.empty:
        return ""
    shown = table.assign(objective=table["objective"].map(lambda c: labels.get(c, c)))
    keep = [c for c in ("network", "prompt_len", "objective", "devices", "placement", "cuts", "value", "vs_one_fewer",
                        "gain") if c in shown.columns]
    body = shown[keep].to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-", border=0)
    return ("<h2>Which devices: what each extra device buys</h2><p>" + html.escape(__doc__.split("\n\n")[1])
            + "</p>" + body)


#: How an extra device's change reads (``gain``); predict --subsets prints the same words.
GAIN_WORDS = {"gain": "a gain", "none": "no gain", "loss": "a loss: the extra device costs"}


def describe(table: pd.DataFrame) -> list[str]:
    """The table as the report prints it: per network (and prompt length), each objective's best
    on k devices, and its change against k - 1."""
    if table.empty:
        return []
    lines = ["which devices (measured): the best configuration on k devices against the best on k - 1"]
    where = [c for c in ("network", "prompt_len") if c in table.columns]
    for key, group in table.groupby(where, sort=False):
        values = key if isinstance(key, tuple) else (key,)
        lines.append("  " + ", ".join(f"{c} {v}" for c, v in zip(where, values)))
        for row in group.to_dict("records"):
            change = "" if row["gain"] != row["gain"] or row["gain"] is None else \
                f"  x{row['vs_one_fewer']:.3f} ({GAIN_WORDS[row['gain']]})"
            lines.append(f"    {row['objective']:<12} {int(row['devices'])} devices: {row['value']:.4g} on "
                         f"{row['placement']}, split {row['cuts']}{change}")
    return lines


def testbed_hosts(meta: dict[str, Any] | None) -> list[str]:
    """The session's testbed hosts' addresses in .env's order (none: it ran on this machine)."""
    testbed = ((meta or {}).get("options") or {}).get("testbed") or {}
    return [h["address"] for h in testbed.get("hosts") or [] if isinstance(h, dict) and "address" in h]
