"""Several testbeds' sessions of one shared search study (``paretopipe search --study``) as one
table: every configuration with the testbed that measured it, one front per network over all of
them, and each configuration that several testbeds measured (the study's reference, measured on
every testbed, at least) with its testbeds' 95% intervals side by side, flagged where two of them
do not overlap: those testbeds disagree beyond their noise, and a front that mixes their
configurations mixes their offsets (search.json's ``reference.offsets`` gives them).

``paretopipe report SESSION SESSION ...`` writes ``testbeds.csv`` and ``testbed_disagreements.csv``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pandas as pd

from .. import records
from ..errors import UsageError
from . import objectives as objectives_mod
from . import pareto
from .session import find_session
from .keys import CONFIG_KEY

GROUP = [k for k in CONFIG_KEY if k != "split_index"]
FILE_NAME = "testbeds.csv"
DISAGREEMENTS = "testbed_disagreements.csv"


def testbed_of(session: Path) -> str:
    """The testbed a session's search recorded (search.json), else the session's folder name."""
    try:
        return str(json.loads((session / "search.json").read_text())["testbed"])
    except (OSError, ValueError, KeyError, TypeError):
        return session.name


def merge(sessions: Sequence[Path]) -> pd.DataFrame:
    """Every session's summary rows, each with its ``testbed`` and ``session``."""
    parts = []
    for path in sessions:
        session = find_session(Path(path))
        parts.append(session.configs().assign(testbed=testbed_of(session.path), session=str(session.path)))
    names = [p["testbed"].iloc[0] for p in parts if len(p)]
    if len(set(names)) < len(names):
        raise UsageError(f"two of these sessions are the same testbed ({', '.join(names)}): give one session per "
                         f"testbed (search --testbed names them)")
    return pd.concat(parts, ignore_index=True)


def disagreements(merged: pd.DataFrame, chosen: Sequence[objectives_mod.Objective]) -> pd.DataFrame:
    """One row per configuration that several testbeds measured completely: per objective with an
    interval, each testbed's value and interval, and whether two intervals fail to overlap."""
    done = merged[merged["status"] == "complete"]
    rows = []
    for key, grp in done.groupby(CONFIG_KEY, dropna=False, sort=True):
        if grp["testbed"].nunique() < 2:
            continue
        row = dict(zip(CONFIG_KEY, key))
        row["testbeds"] = ",".join(grp["testbed"])
        apart = []
        for o in chosen:
            if not o.interval:
                continue
            low, high = o.interval
            row[o.name] = "; ".join(f"{r['testbed']} {r[o.column]:.4g} [{r[low]:.4g}, {r[high]:.4g}]"
                                    for _, r in grp.iterrows())
            if grp[low].max() > grp[high].min():   # some interval lies wholly above another
                apart.append(o.name)
        single = [str(r["testbed"]) for _, r in grp.iterrows() if not r.get("runs", 0) >= 2]
        if single:   # one run has no interval: nothing to judge the difference against
            row["disagree"], row["disagree_on"] = None, f"not judged: one run on {', '.join(single)}"
        else:
            row["disagree"], row["disagree_on"] = bool(apart), ",".join(apart)
        rows.append(row)
    return pd.DataFrame(rows, columns=CONFIG_KEY + ["testbeds"] + [o.name for o in chosen if o.interval]
                        + ["disagree", "disagree_on"])


def merged_fronts(merged: pd.DataFrame, chosen: Sequence[objectives_mod.Objective]) -> pd.DataFrame:
    """``merged`` with ``on_front``: one front per model, backend, cipher, transport, network and
    batch size over every testbed's configurations. A configuration several testbeds measured
    stands on the front by the first session's measurement (the others are listed, never on it)."""
    first = ~merged.duplicated(CONFIG_KEY, keep="first")
    out = merged.copy()
    out["on_front"] = False
    marked = pareto.mark_front(merged[first], objectives_mod.senses(chosen), GROUP)
    out.loc[marked.index, "on_front"] = marked["on_front"]
    return out


def write(sessions: Sequence[Path], out: Path, objectives: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """testbeds.csv and testbed_disagreements.csv in ``out``; (the merged table, the disagreements)."""
    merged = merge(sessions)
    chosen = objectives_mod.parse(objectives, merged)
    table = merged_fronts(merged, chosen)
    flags = disagreements(merged, chosen)
    out.mkdir(parents=True, exist_ok=True)
    records.atomic_write_csv(out / FILE_NAME, table.to_dict("records"), list(table.columns))
    records.atomic_write_csv(out / DISAGREEMENTS, flags.to_dict("records"), list(flags.columns))
    return table, flags


def describe(table: pd.DataFrame, flags: pd.DataFrame, chosen_names: Sequence[str]) -> list[str]:
    """The lines ``report`` prints for several testbeds."""
    counts = table.groupby("testbed").size()
    each = ", ".join(f"{t}: {n} configuration" + ("s" if n != 1 else "") for t, n in counts.items())
    lines = [f"testbeds: {len(counts)} ({each})"]
    for _, r in table[table["on_front"]].iterrows():
        lines.append(f"  on the front ({r['network']}): split {r['split_index']} from {r['testbed']}")
    for _, f in flags.iterrows():
        verdict = (f["disagree_on"] if f["disagree"] is None or pd.isna(f["disagree"])
                   else f"DISAGREE on {f['disagree_on']}" if f["disagree"] else "agree within their intervals")
        detail = "; ".join(f"{n}: {f[n]}" for n in chosen_names if n in f and isinstance(f[n], str))
        lines.append(f"  split {f['split_index']} ({f['network']}) measured on {f['testbeds']}: {verdict} ({detail})")
    return lines
