"""Checks a report runs on its own session before anyone trusts its front.

- Stage 1 computes blocks 1..k, so its compute time cannot fall as k grows; stage 2 computes the
  rest, so its time cannot rise. A violation beyond the 95% CIs means the machine changed speed
  during the sweep (or something else was measured).
- Under a shaped link the transfer cannot be faster than its bytes at the link's rate plus its
  delay, both ways.
- Runs on a throttled CPU (a Pi's get_throttled, or cpufreq below the rated maximum), and drift
  of the reference configuration that the sweep caught, are listed too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from ..network.conditions import NetworkConditions
from .keys import CONFIG_KEY

#: A shaped transfer may read this much below bytes/rate + delay before it is flagged (clocks,
#: the emulator's and htb's own accounting).
TRANSFER_SLACK = 0.10
#: The check of a note, not a violation: stage compute not judged where a configuration had one run.
NOT_JUDGED = "stage_compute_not_judged"


def _int_splits(frame: pd.DataFrame) -> pd.DataFrame:
    keep = [str(k).lstrip("-").isdigit() for k in frame["split_index"]]
    out = frame[keep].copy()
    out["_k"] = [int(k) for k in out["split_index"]]
    return out.sort_values("_k")


def monotone_violations(summary: pd.DataFrame, stage: int, rising: bool) -> list[dict[str, Any]]:
    """Splits whose stage compute is beyond the CIs of an earlier split's in the wrong direction."""
    col = f"stage{stage}_compute_median_s"
    lo_col, hi_col = f"stage{stage}_compute_ci95_low_s", f"stage{stage}_compute_ci95_high_s"
    if col not in summary.columns:
        return []
    out = []
    # One configuration but its split: a fault's pass (or a codec's, a scenario's) is compared within itself.
    by = [c for c in CONFIG_KEY if c != "split_index" and c in summary.columns]
    for values, g in summary.groupby(by, sort=False, dropna=False):
        key = dict(zip(by, values))
        g = _with_interval(g)
        if g.empty:
            continue
        g = _int_splits(g).dropna(subset=[col])
        point = g[col].to_numpy(dtype=float)
        lo = g[lo_col].to_numpy(dtype=float) if lo_col in g else point
        hi = g[hi_col].to_numpy(dtype=float) if hi_col in g else point
        lo, hi = np.where(np.isnan(lo), point, lo), np.where(np.isnan(hi), point, hi)
        ks = g["_k"].tolist()
        for j in range(1, len(g)):
            if rising:  # stage 1: a later split must not be below every bound of an earlier one
                i = int(np.argmax(lo[:j]))
                bad = hi[j] < lo[i]
            else:       # stage 2: a later split must not be above an earlier one
                i = int(np.argmin(hi[:j]))
                bad = lo[j] > hi[i]
            if bad:
                out.append({"check": f"stage{stage}_compute_{'falls' if rising else 'rises'}_as_k_grows",
                            "model": key["model"], "backend": key["backend"], "network": key["network"],
                            "batch_size": key["batch_size"],
                            "configurations": f"k={ks[i]} vs k={ks[j]}" + _sealed(key.get("cipher"))
                            + _carried(key.get("transport")),
                            "detail": f"stage {stage} compute {point[i] * 1e3:.2f} ms [{lo[i] * 1e3:.2f}, "
                                      f"{hi[i] * 1e3:.2f}] at k={ks[i]} but {point[j] * 1e3:.2f} ms [{lo[j] * 1e3:.2f}, "
                                      f"{hi[j] * 1e3:.2f}] at k={ks[j]}"})
    return out


def _with_interval(configs: pd.DataFrame) -> pd.DataFrame:
    """The configurations measured in two runs or more: one run's "interval" is its own median, so
    any noise would read as a violation (52 of 76 configurations, one run each, on a GPU testbed)."""
    return configs if "runs" not in configs.columns else configs[configs["runs"].fillna(0) >= 2]


def unjudged(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """One note for the configurations whose stage compute no check could judge (one run each)."""
    if "runs" not in summary.columns or summary.empty:
        return []
    single = int((summary["runs"] == 1).sum())  # an infeasible configuration (0 runs) has nothing to judge
    if not single:
        return []
    return [{"check": NOT_JUDGED, "model": "", "backend": "", "network": "", "batch_size": "",
             "configurations": f"{single} of {len(summary)} configurations",
             "detail": "measured in one run each: no 95% interval to judge stage compute against its neighbours by "
                       "(--runs 2 or more)"}]


def _carried(transport: Any) -> str:
    """A configuration label's transport, for configurations over another than raw TCP."""
    return f" over {transport}" if isinstance(transport, str) and transport != "tcp" else ""


def _sealed(cipher: Any) -> str:
    """A configuration label's cipher, for sealed configurations only."""
    return f" ({cipher})" if isinstance(cipher, str) and cipher != "none" else ""


def transfer_violations(summary: pd.DataFrame, networks: dict[str, Any], link_modes: dict[str, str]
                        ) -> list[dict[str, Any]]:
    """Shaped configurations whose median transfer beats bytes/rate + delay (both ways)."""
    out = []
    for _, row in summary.iterrows():
        spec = networks.get(row["network"])
        if spec is None or link_modes.get(row["network"]) in (None, "none"):
            continue
        cond = NetworkConditions.from_dict(spec)
        up, down = cond.up, cond.down
        wire_up = row.get("wire_bytes_mean")
        wire_down = row.get("result_wire_bytes_mean")
        if not up.rate_bps or wire_up is None or pd.isna(wire_up) or pd.isna(row.get("transfer_median_s")):
            continue
        least = (8 * float(wire_up) / up.rate_bps + up.delay_s
                 + (8 * float(wire_down) / down.rate_bps if down.rate_bps and pd.notna(wire_down) else 0.0)
                 + down.delay_s)
        if row["transfer_median_s"] < (1 - TRANSFER_SLACK) * least:
            out.append({"check": "transfer_faster_than_the_link", "model": row["model"], "backend": row["backend"],
                        "network": row["network"], "batch_size": row["batch_size"],
                        "configurations": f"k={row['split_index']}" + _sealed(row.get("cipher"))
                        + _carried(row.get("transport")),
                        "detail": f"median transfer {row['transfer_median_s'] * 1e3:.2f} ms < bytes/rate + delay "
                                  f"{least * 1e3:.2f} ms ({up.describe()})"})
    return out


def throttled_runs(runs: pd.DataFrame) -> list[dict[str, Any]]:
    if "throttled" not in runs.columns:
        return []
    flagged = runs[runs["throttled"].astype(str).str.lower() == "true"]
    return [{"check": "cpu_throttled", "model": r["model"], "backend": r["backend"], "network": r["network"],
             "batch_size": r["batch_size"], "configurations": r["run_key"],
             "detail": "a stage's CPU was throttled during this run (get_throttled or cpufreq below its maximum)"}
            for _, r in flagged.iterrows()]


def drift_events(meta: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    for group, info in ((meta or {}).get("groups") or {}).items():
        for check in info.get("drift_checks") or []:
            model, _, backend = group.partition("/")
            if check.get("drift"):
                out.append({"check": "drift", "model": model, "backend": backend, "network": check.get("network"),
                            "batch_size": None, "configurations": f"{len(check.get('runs_since') or [])} runs measured again",
                            "detail": f"reference throughput moved {check['change']:.0%} (threshold "
                                      f"{check['threshold']:.0%}) at {check['time_s']:.0f} s"})
            elif check.get("rebaselined"):
                out.append({"check": "drift_held", "model": model, "backend": backend, "network": check.get("network"),
                            "batch_size": None, "configurations": "baseline moved",
                            "detail": f"reference throughput stayed {check['change']:.0%} from its baseline "
                                      f"{check['baseline_throughput']:.1f} images/s at {check['time_s']:.0f} s: the "
                                      f"machine's new speed, now the baseline"})
    return out


def sanity_checks(summary: pd.DataFrame, runs: pd.DataFrame, meta: dict[str, Any] | None) -> pd.DataFrame:
    """Every violation, one row each: check, the front it concerns, the configurations, what was seen."""
    link_modes = {}
    if "link_mode" in runs.columns:
        link_modes = {n: str(g["link_mode"].dropna().iloc[0]) for n, g in runs.groupby("network") if
                      g["link_mode"].notna().any()}
    rows = (monotone_violations(summary, 1, rising=True) + monotone_violations(summary, 2, rising=False)
            + transfer_violations(summary, (meta or {}).get("networks") or {}, link_modes)
            + throttled_runs(runs) + drift_events(meta) + unjudged(summary))
    cols = ["check", "model", "backend", "network", "batch_size", "configurations", "detail"]
    return pd.DataFrame(rows, columns=cols)


def format_sanity(table: pd.DataFrame) -> str:
    notes = table[table["check"] == NOT_JUDGED]
    table = table[table["check"] != NOT_JUDGED]
    unjudged_line = [f"  not judged: stage compute of {r['configurations']}, {r['detail']}" for _, r in notes.iterrows()]
    if table.empty:
        return "\n".join(["sanity checks: none violated (stage-1 compute never falls with k, stage-2 never rises, "
                          "transfers respect their links, no throttling, no drift)"] + unjudged_line)
    lines = [f"sanity checks: {len(table)} violation(s)"]
    lines += [f"  {r['check']}: {r['model']} {r['backend']} {r['network']}: {r['configurations']}: {r['detail']}"
              for _, r in table.iterrows()]
    return "\n".join(lines + unjudged_line)
