"""Validation of the cost model against a measured sweep: every TCP configuration is predicted by
replaying its own protocol, and the errors and the agreement of the fronts are reported."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from .. import engines, records
from ..analysis import pareto
from ..analysis.report import INTERVALS
from ..analysis.keys import DEFAULT_CODEC
from ..analysis.session import Session, find_session
from ..errors import UsageError
from ..network.conditions import NetworkConditions, get_conditions
from .costmodel import LinkModel, chain_terms, simulate
from .device_profile import DeviceProfile, check_compatible, codec_key
from .predictions import PREDICTED, base_transport
from ..wiredtype import AUTO
from ..analysis.plotting import PALETTE, plain_log_ticks, pyplot, save_figure

log = logging.getLogger("paretopipe.predict")

MEASURED = {"latency_s": "min", "throughput_imgs_per_s": "max"}
GOAL_MAPE = 0.15
GOAL_JACCARD = 0.8
#: summary.csv's fidelity figures a validation row carries beside its timings (transport.fidelity).
MEASURED_FIDELITY = ("fidelity_top1_agreement", "fidelity_kl_mean", "accuracy_top1", "accuracy_top1_float32")


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def front_name(network: str, cipher: str, codec: str = DEFAULT_CODEC) -> str:
    """One front of a sweep: a network's, and a sealed configuration's or one of another wire codec
    apart from the plain float32 one's."""
    apart = [x for x, plain in ((cipher, "none"), (codec, DEFAULT_CODEC)) if x == x and x != plain]
    return f"{network} ({', '.join(apart)})" if apart else network


def _with_front(table: pd.DataFrame) -> pd.DataFrame:
    codecs = table["codec"] if "codec" in table.columns else [DEFAULT_CODEC] * len(table)
    return table.assign(front=[front_name(n, c, k) for n, c, k in zip(table["network"], table["cipher"], codecs)])


def of_engine(table: pd.DataFrame, label: str) -> pd.DataFrame:
    """The rows a table measured on engine ``label`` (a table from before engines: torch's)."""
    engine = table["engine"].fillna(engines.TORCH) if "engine" in table.columns else pd.Series(engines.TORCH,
                                                                                               index=table.index)
    return table[engine == label]


def profiles_engine(profiles: Sequence[DeviceProfile]) -> str:
    """The engine label of a split whose stages the profiles time, in stage order."""
    names = [p.engine for p in profiles]
    return engines.JOIN.join(names) if len(set(names)) > 1 else names[0]


def run_to_run_jaccard(session: Session, epsilons: dict[str, Sequence[float]] | None = None,
                       engine: str = engines.TORCH) -> dict[str, float]:
    """Per front (network and cipher): how well the sweep agrees with itself, the most any
    prediction can agree with a measurement this noisy: the mean Jaccard of its epsilon-front and
    those of sweeps resampled from its own runs (:func:`pareto.resampled_front_agreement`), with
    ``epsilons`` per front (the noise of its medians; 0 where not given, the strict front)."""
    runs = of_engine(session.runs(), engine)
    runs = _with_front(runs[(runs["backend"] == "tcp") & (runs["status"] == "complete")]
                       .assign(latency_s=runs["latency_median_s"]))
    out = {}
    for name, g in runs.groupby("front", sort=False):
        eps = (epsilons or {}).get(name, [0.0] * len(MEASURED))
        agreement = pareto.resampled_front_agreement(g, ["split_index"], MEASURED, eps)
        if agreement is not None:
            out[name] = agreement
    return out


def _stage_limits(session: Session) -> dict[str, dict[str, Any]]:
    """What each stage of the sweep ran under (threads, affinity, CPU share), from one run record."""
    for path in sorted(session.runs_dir.glob("*.json"))[:1]:
        rec = session.read_run(path)
        limits = (rec or {}).get("config", {}).get("stage_limits") or {}
        return {k: v for k, v in limits.items() if isinstance(v, dict)}
    return {}


def _effective_share(limits: dict[str, Any]) -> float | None:
    """A share at or above the thread count limits nothing: treat it as no share."""
    share = limits.get("cpu_share")
    return None if share is None or share >= (limits.get("torch_threads") or 1) else share


def limit_mismatches(profiles: Sequence[DeviceProfile], limits: dict[str, dict[str, Any]]) -> list[str]:
    """Where a device profile was taken under other threads or another CPU share than its stage ran."""
    out = []
    for i, p in enumerate(profiles, start=1):
        ran = limits.get(f"stage{i}") or {}
        if ran.get("torch_threads") and p.doc["manifest"].get("torch_threads") != ran["torch_threads"]:
            out.append(f"{p.path} used {p.doc['manifest'].get('torch_threads')} torch threads; stage {i} ran "
                       f"with {ran['torch_threads']}")
        if ran and _effective_share(p.limits) != _effective_share(ran):
            out.append(f"{p.path} was taken at CPU share {_effective_share(p.limits)}; stage {i} ran at "
                       f"{_effective_share(ran)}")
    return out


def _boundary(profile: DeviceProfile, written: Any) -> tuple[int | str, int]:
    """A measured split (a block index, or a fine cut's name from ``--max-live``) and the profile's
    boundary it is: a fine cut is there when the profile was made with ``--max-live``."""
    label = str(written)
    if label.lstrip("-").isdigit():
        k = int(label)
        if k not in profile.blocks:
            raise UsageError(f"split {k} of the sweep is not a block split of {profile.path}")
        return k, profile.blocks[k]
    if label not in profile.boundaries:
        raise UsageError(f"split {label} of the sweep is not a boundary of {profile.path}; profile with "
                         f"--max-live as wide as the sweep's")
    return label, profile.boundaries.index(label)


def _predicted_rows(configs: pd.DataFrame, profiles: Sequence[DeviceProfile], known: dict[str, NetworkConditions],
                    base: Any, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured configuration beside its prediction (the TCP protocol replayed with the
    profiles' durations over its network) and the absolute percentage errors."""
    rows = []
    for _, c in configs.iterrows():
        up, down = LinkModel.pair(known.get(c["network"]) or get_conditions(c["network"]), base)
        k, boundary = _boundary(profiles[0], c["split_index"])
        # Its own wire codec (a sweep may measure several; auto priced as float32, its upper bound)
        # and the cipher its runs recorded (auto resolved): the profiles' timings of those.
        wire, _, compression = str(c.get("codec") or DEFAULT_CODEC).partition("/")
        codec = codec_key("float32" if wire == AUTO else wire, compression or "none", c["cipher"])
        terms = chain_terms(profiles, [up], [boundary], int(c["batch_size"]), codec, [down])
        sim = simulate(terms, int(opts.get("num_batches", 20)), int(opts.get("warmup", 3)),
                       int(opts.get("in_flight", 1)))
        row = {"network": c["network"], "cipher": c["cipher"], "codec": c.get("codec") or DEFAULT_CODEC,
               "front": front_name(c["network"], c["cipher"], c.get("codec") or DEFAULT_CODEC),
               "split_index": k, "cut": c["cut"], "batch_size": int(c["batch_size"]),
               # What a lossy wire kept, measured beside the timings (absent for float32 unless asked).
               **{col: c[col] for col in MEASURED_FIDELITY if col in c and c[col] == c[col]},
               "latency_s": c["latency_median_s"], "throughput_imgs_per_s": c["throughput_imgs_per_s"],
               **{col: c.get(col) for pair in INTERVALS.values() for col in pair},
               **sim, "predicted_bottleneck": terms.bottleneck()[0]}
        row["latency_ape"] = abs(row["predicted_latency_s"] - row["latency_s"]) / row["latency_s"]
        row["throughput_ape"] = (abs(row["predicted_throughput_imgs_per_s"] - row["throughput_imgs_per_s"])
                                 / row["throughput_imgs_per_s"])
        rows.append(row)
    return rows


def _front_agreement(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per front (network and cipher): the measured and predicted fronts, strict and within the
    measured noise (epsilon-fronts, one epsilon per objective from the front's 95% intervals for
    both), their Jaccard indices, and the median errors. Marks the table's front columns on the way."""
    measured = pareto.mark_front(table, MEASURED, by=["front"])["on_front"]
    predicted = pareto.mark_front(table, PREDICTED, by=["front"])["on_front"]
    table["measured_on_front"], table["predicted_on_front"] = measured, predicted
    table["measured_status"] = pareto.front_status(table, INTERVALS, MEASURED, by=["front"])
    per_network = {}
    for name, g in table.groupby("front", sort=False):
        eps = pareto.interval_epsilon(g, INTERVALS, MEASURED)
        m = set(g.loc[g["measured_on_front"], "split_index"])
        me = set(g.loc[g["measured_status"].isin([pareto.FRONT, pareto.TIED]), "split_index"])
        p = set(g.loc[g["predicted_on_front"], "split_index"])
        pe = set(g.loc[pareto.epsilon_front_mask(g[list(PREDICTED)].to_numpy(dtype=float), list(PREDICTED.values()),
                                                 eps), "split_index"])
        per_network[name] = {"jaccard": jaccard(me, pe), "strict_jaccard": jaccard(m, p),
                             "epsilon": dict(zip(MEASURED, map(float, eps))),
                             "measured_front": sorted(m), "measured_tied": sorted(me - m), "predicted_front": sorted(p),
                             "measured_epsilon_front": sorted(me), "predicted_epsilon_front": sorted(pe),
                             "beyond_noise": sorted(pe - me), "missed": sorted(me - pe),
                             "latency_mape": float(g["latency_ape"].median()),
                             "throughput_mape": float(g["throughput_ape"].median())}
    return per_network


def judge(per_network: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which fronts the goal is stated on: those whose sweep agrees with itself (its epsilon-front
    against its runs resampled at Jaccard >= the goal, or a single run that cannot say). A front the
    sweep cannot reproduce cannot be predicted either; it is named with its figures and left out of
    the verdict."""
    judged = [n for n, v in per_network.items() if pareto.reproduces(v.get("run_to_run_jaccard"), GOAL_JACCARD)]
    unjudged = {n: v["run_to_run_jaccard"] for n, v in per_network.items() if n not in judged}
    mean = float(statistics.fmean(per_network[n]["jaccard"] for n in judged)) if judged else None
    return {"judged_fronts": judged, "unjudged_fronts": unjudged, "front_jaccard_mean": mean}


def validate(session_dir: str | Path, profiles: Sequence[DeviceProfile], base_rate: str | None = None
             ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Predict every measured TCP configuration of a sweep with its own protocol and compare."""
    session = find_session(session_dir)
    meta = session.read_meta()
    if meta is None:
        raise UsageError(f"{session.path} has no session.json; validate a sweeper session")
    opts = meta.get("options", {})
    configs = session.configs()
    engine = profiles_engine(profiles)
    measured = sorted(set(configs["engine"].fillna(engines.TORCH))) if "engine" in configs.columns else [engines.TORCH]
    configs = of_engine(configs[configs["backend"] == "tcp"], engine)
    if configs.empty:
        raise UsageError(f"{session.path} has no completed TCP configurations on engine {engine} to compare with (the "
                         f"cost model replays the TCP backend's protocol; the session measured "
                         f"{', '.join(measured)}: profile each stage with paretopipe profile --engine ENGINE)")
    warnings = check_compatible(profiles, str(configs["model"].iloc[0]))
    warnings += limit_mismatches(profiles, _stage_limits(session))
    for w in warnings:
        log.warning("%s", w)
    base = base_transport(profiles, base_rate or ("loopback" if not opts.get("hosts", {}).get("stage1") else None))
    known = {name: NetworkConditions.from_dict(d) for name, d in meta.get("networks", {}).items()}
    table = pd.DataFrame(_predicted_rows(configs, profiles, known, base, opts))
    per_network = _front_agreement(table)
    ceiling = run_to_run_jaccard(session, {n: list(v["epsilon"].values()) for n, v in per_network.items()}, engine)
    for name, value in ceiling.items():
        per_network[name]["run_to_run_jaccard"] = value
    summary = {
        "session": str(session.path), "configurations": len(table), "engine": engine,
        "latency_median_ape": float(table["latency_ape"].median()),
        "throughput_median_ape": float(table["throughput_ape"].median()),
        **judge(per_network),
        "run_to_run_jaccard_mean": float(statistics.fmean(ceiling.values())) if ceiling else None,
        "per_network": per_network,
        "goals": {"median_ape_max": GOAL_MAPE, "jaccard_min": GOAL_JACCARD},
        "device_profiles": [p.path for p in profiles], "protocol": {k: opts.get(k) for k in (
            "batch_size", "num_batches", "warmup", "in_flight", "wire_dtype", "compression")},
        "transport_beneath": base, "warnings": warnings,
        "beyond_noise": {n: v["beyond_noise"] for n, v in per_network.items() if v["beyond_noise"]},
        "note": "each configuration is predicted by replaying the TCP protocol (window, warm-up, batch count) "
                "with durations from the device profiles; measured values are the sweep's per-configuration "
                "medians; fronts are compared within the measured noise: a split is off a front (its "
                "epsilon-front) only when another beats it by more than epsilon on one objective and is no "
                "worse, beyond epsilon, on any; epsilon per objective and front is the median relative "
                "half-width of the sweep's 95% intervals there, for the measured and the predicted medians "
                "alike; jaccard compares the measured and predicted epsilon-fronts, strict_jaccard the strict "
                "fronts; beyond_noise lists predicted front points the measurement dominates by more than the "
                "noise; run_to_run_jaccard is how well the sweep agrees with itself: the mean Jaccard of its "
                "epsilon-front and those of bootstrap resamples of each configuration's runs, "
                "the most any prediction can agree with a measurement this noisy; the goal is judged on the "
                "fronts where that agreement reaches the goal (judged_fronts)",
    }
    # No front the sweep reproduces: none is judged, and the errors alone decide (the line says so).
    summary["goals_met"] = (summary["latency_median_ape"] <= GOAL_MAPE and summary["throughput_median_ape"] <= GOAL_MAPE
                            and (summary["front_jaccard_mean"] is None
                                 or summary["front_jaccard_mean"] >= GOAL_JACCARD))
    return table, summary


def epsilon_jaccard_words(summary: dict[str, Any]) -> str:
    """The verdict's front figure in words: the epsilon-Jaccard mean over the judged fronts."""
    mean = summary["front_jaccard_mean"]
    if mean is None:
        return "no front the sweep reproduces, so none is judged and the errors decide"
    return f"epsilon-front Jaccard {mean:.2f} over {', '.join(summary['judged_fronts'])}"


def kept_line(table: pd.DataFrame, front: str) -> str | None:
    """What each split's lossy wire kept on one front, as measured (accuracy on labelled data, else
    top-1 agreement with the unsplit float32 model): the line ``predict --validate`` prints under it;
    None where the sweep evaluated nothing there."""
    rows = table[table["front"] == front]
    for column, what in (("accuracy_top1", "top-1 accuracy"), ("fidelity_top1_agreement", "top-1 agreement")):
        if column in rows.columns and rows[column].notna().any():
            kept = ", ".join(f"k={r['split_index']} {r[column]:.3f}" for _, r in rows.iterrows() if r[column] == r[column])
            return f"kept by the wire ({what} with the unsplit float32 model, measured): {kept}"
    return None


def write_validation(table: pd.DataFrame, summary: dict[str, Any], out: Path) -> list[Path]:
    paths = [records.atomic_write_csv(out / "prediction_validation.csv", table.to_dict("records")),
             records.atomic_write_json(out / "prediction_validation.json", summary)]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (m, p, unit, scale) in zip(axes, (("latency_s", "predicted_latency_s", "latency (ms)", 1e3),
                                              ("throughput_imgs_per_s", "predicted_throughput_imgs_per_s",
                                               "throughput (images/s)", 1.0))):
        for i, (name, g) in enumerate(table.groupby("network", sort=False)):
            ax.scatter(g[m] * scale, g[p] * scale, s=18, color=PALETTE[i % len(PALETTE)], label=name)
        lo = min(table[m].min(), table[p].min()) * scale
        hi = max(table[m].max(), table[p].max()) * scale
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_ticks(ax.xaxis)
        plain_log_ticks(ax.yaxis)
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"prediction vs measurement: median error latency {summary['latency_median_ape']:.0%}, "
                 f"throughput {summary['throughput_median_ape']:.0%}; {epsilon_jaccard_words(summary)}", fontsize=10)
    fig.tight_layout()
    paths.append(save_figure(fig, out / "prediction_validation.png", dpi=120))
    return paths
