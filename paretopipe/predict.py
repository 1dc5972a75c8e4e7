"""Predict every split from per-device profiles, draw the optimal split versus bandwidth, plan
N-device chains, and validate the predictions against a measured sweep.

``python -m paretopipe.predict --model M --stage-profiles edge.json,server.json --profiles lte,wifi``
Every figure printed or written here is modelled (``predicted_*``), never measured; ``--validate``
says how far it is from a measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from . import pareto, records
from .costmodel import LinkModel, chain_terms, simulate
from .errors import UsageError
from .link import Profile, get_profile
from .planner import pareto_plans, split_blocks
from .profile import DeviceProfile, check_compatible, codec_key
from .units import parse_rate

log = logging.getLogger("paretopipe.predict")

PREDICTED = {"predicted_latency_s": "min", "predicted_throughput_imgs_per_s": "max"}
MEASURED = {"latency_s": "min", "throughput_imgs_per_s": "max"}
GOAL_MAPE = 0.15
GOAL_JACCARD = 0.8


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


def predict_splits(profiles: Sequence[DeviceProfile], link: LinkModel, batch_size: int, codec: str,
                   fine: bool = False) -> pd.DataFrame:
    """One row per split of a 2-device chain: every term, the latency, the throughput, the front."""
    rows = []
    for label, boundary in split_positions(profiles[0], fine):
        terms = chain_terms(profiles, [link], [boundary], batch_size, codec)
        rows.append({"profile": link.name, "split": label, "cut": profiles[0].boundaries[boundary],
                     "boundary": boundary, "batch_size": batch_size, **terms.as_row()})
    table = pd.DataFrame(rows)
    return pareto.mark_front(table, PREDICTED, by=["profile"])


def rate_map(profiles: Sequence[DeviceProfile], link: LinkModel, rates_bps: Sequence[float], batch_size: int,
             codec: str, fine: bool = False) -> pd.DataFrame:
    """For each rate: the latency-optimal and the throughput-optimal split, and their values."""
    rows = []
    for rate in rates_bps:
        table = predict_splits(profiles, link.with_rate(rate), batch_size, codec, fine)
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
    from .report import PALETTE, pyplot, save_figure

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


# -- validation against a measured sweep ---------------------------------------------------------
def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def run_to_run_jaccard(session: Path) -> dict[str, float]:
    """Per profile: how well the fronts of the sweep's separate runs agree with each other (mean
    pairwise Jaccard). This is the ceiling for any prediction: measured noise moves fronts too."""
    from itertools import combinations

    from .report import load_runs

    runs = load_runs(session)
    runs = runs[(runs["backend"] == "tcp") & (runs["status"] == "complete")]
    out = {}
    for name, g in runs.groupby("profile", sort=False):
        fronts = [set(r.loc[pareto.mark_front(r, MEASURED, by=[])["on_front"], "split_index"])
                  for _, r in g.groupby("run")]
        pairs = [_jaccard(a, b) for a, b in combinations(fronts, 2)]
        if pairs:
            out[name] = float(statistics.fmean(pairs))
    return out


def _session_protocol(session: Path) -> dict[str, Any]:
    try:
        meta = json.loads((session / "session.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{session} has no readable session.json ({exc}); validate a sweeper session")
    return meta


def _stage_limits(session: Path) -> dict[str, dict[str, Any]]:
    """What each stage of the sweep ran under (threads, affinity, CPU share), from one run JSON."""
    for path in sorted((session / "runs").glob("*.json"))[:1]:
        try:
            limits = json.loads(path.read_text())["config"].get("stage_limits") or {}
        except (OSError, ValueError, KeyError):
            continue
        return {k: v for k, v in limits.items() if isinstance(v, dict)}
    return {}


def _effective_share(limits: dict[str, Any]) -> float | None:
    """A share at or above the thread count limits nothing: treat it as no share."""
    share = limits.get("cpu_share")
    return None if share is None or share >= (limits.get("torch_threads") or 1) else share


def limit_mismatches(profiles: Sequence[DeviceProfile], limits: dict[str, dict[str, Any]]) -> list[str]:
    """Where a profile was taken under other threads or another CPU share than its stage ran."""
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


def validate(session_dir: str | Path, profiles: Sequence[DeviceProfile], base_rate: str | None = None
             ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Predict every measured TCP configuration of a sweep with its own protocol and compare."""
    from .report import find_session, load_configs

    session = find_session(session_dir)
    meta = _session_protocol(session)
    opts = meta.get("options", {})
    configs = load_configs(session)
    configs = configs[configs["backend"] == "tcp"]
    if configs.empty:
        raise UsageError(f"{session} has no completed TCP configurations to compare with (the cost model "
                         f"replays the TCP backend's protocol)")
    warnings = check_compatible(profiles, str(configs["model"].iloc[0]))
    warnings += limit_mismatches(profiles, _stage_limits(session))
    for w in warnings:
        log.warning("%s", w)
    base = base_transport(profiles, base_rate or ("loopback" if not opts.get("hosts", {}).get("stage1") else None))
    codec = codec_key(opts.get("wire_dtype", "float32"), opts.get("compression", "none"))
    links = {name: LinkModel.from_profile(Profile.from_dict(d), base) for name, d in meta.get("profiles", {}).items()}
    rows = []
    for _, c in configs.iterrows():
        link = links.get(c["profile"]) or LinkModel.from_profile(get_profile(c["profile"]), base)
        k = int(c["split_index"])
        if k not in profiles[0].blocks:
            raise UsageError(f"split {k} of the sweep is not a block split of {profiles[0].path}")
        terms = chain_terms(profiles, [link], [profiles[0].blocks[k]], int(c["batch_size"]), codec)
        sim = simulate(terms, int(opts.get("num_batches", 20)), int(opts.get("warmup", 3)),
                       int(opts.get("in_flight", 1)))
        row = {"profile": c["profile"], "split_index": k, "cut": c["cut"], "batch_size": int(c["batch_size"]),
               "latency_s": c["latency_median_s"], "throughput_imgs_per_s": c["throughput_imgs_per_s"],
               **sim, "predicted_bottleneck": terms.bottleneck()[0]}
        row["latency_ape"] = abs(row["predicted_latency_s"] - row["latency_s"]) / row["latency_s"]
        row["throughput_ape"] = (abs(row["predicted_throughput_imgs_per_s"] - row["throughput_imgs_per_s"])
                                 / row["throughput_imgs_per_s"])
        rows.append(row)
    table = pd.DataFrame(rows)
    measured = pareto.mark_front(table, MEASURED, by=["profile"])["on_front"]
    predicted = pareto.mark_front(table, PREDICTED, by=["profile"])["on_front"]
    table["measured_on_front"], table["predicted_on_front"] = measured, predicted
    per_profile = {}
    for name, g in table.groupby("profile", sort=False):
        m = set(g.loc[g["measured_on_front"], "split_index"])
        p = set(g.loc[g["predicted_on_front"], "split_index"])
        per_profile[name] = {"jaccard": _jaccard(m, p), "measured_front": sorted(m), "predicted_front": sorted(p),
                             "latency_mape": float(g["latency_ape"].median()),
                             "throughput_mape": float(g["throughput_ape"].median())}
    ceiling = run_to_run_jaccard(session)
    for name, value in ceiling.items():
        per_profile[name]["run_to_run_jaccard"] = value
    summary = {
        "session": str(session), "configurations": len(table),
        "latency_median_ape": float(table["latency_ape"].median()),
        "throughput_median_ape": float(table["throughput_ape"].median()),
        "front_jaccard_mean": float(statistics.fmean(v["jaccard"] for v in per_profile.values())),
        "run_to_run_jaccard_mean": float(statistics.fmean(ceiling.values())) if ceiling else None,
        "per_profile": per_profile,
        "goals": {"median_ape_max": GOAL_MAPE, "jaccard_min": GOAL_JACCARD},
        "stage_profiles": [p.path for p in profiles], "protocol": {k: opts.get(k) for k in (
            "batch_size", "num_batches", "warmup", "in_flight", "wire_dtype", "compression")},
        "transport_beneath": base, "warnings": warnings,
        "note": "each configuration is predicted by replaying the TCP protocol (window, warm-up, batch count) "
                "with durations from the profiles; measured values are the sweep's per-configuration medians; "
                "run_to_run_jaccard compares the fronts of the sweep's own runs with each other, the most "
                "any prediction can agree with a measurement this noisy",
    }
    summary["goals_met"] = (summary["latency_median_ape"] <= GOAL_MAPE and summary["throughput_median_ape"] <= GOAL_MAPE
                            and summary["front_jaccard_mean"] >= GOAL_JACCARD)
    return table, summary


def write_validation(table: pd.DataFrame, summary: dict[str, Any], out: Path) -> list[Path]:
    paths = [records.atomic_write_csv(out / "prediction_validation.csv", table.to_dict("records")),
             records.atomic_write_json(out / "prediction_validation.json", summary)]
    from .report import PALETTE, pyplot, save_figure

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (m, p, unit, scale) in zip(axes, (("latency_s", "predicted_latency_s", "latency (ms)", 1e3),
                                              ("throughput_imgs_per_s", "predicted_throughput_imgs_per_s",
                                               "throughput (images/s)", 1.0))):
        for i, (name, g) in enumerate(table.groupby("profile", sort=False)):
            ax.scatter(g[m] * scale, g[p] * scale, s=18, color=PALETTE[i % len(PALETTE)], label=name)
        lo = min(table[m].min(), table[p].min()) * scale
        hi = max(table[m].max(), table[p].max()) * scale
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"prediction vs measurement: median error latency {summary['latency_median_ape']:.0%}, "
                 f"throughput {summary['throughput_median_ape']:.0%}; front Jaccard "
                 f"{summary['front_jaccard_mean']:.2f}", fontsize=10)
    fig.tight_layout()
    paths.append(save_figure(fig, out / "prediction_validation.png", dpi=120))
    return paths


# -- command line --------------------------------------------------------------------------------
def _links_for(args: argparse.Namespace, base: dict[str, Any], hops: int) -> list[list[LinkModel]]:
    """One list of hop links per network condition to evaluate."""
    from .cli import profile_from_args

    adhoc = profile_from_args(args)
    if args.links:
        names = [x.strip() for x in args.links.split(",") if x.strip()]
        if len(names) != hops:
            raise UsageError(f"--links {args.links!r}: {hops + 1} devices need {hops} links, one profile each")
        return [[LinkModel.from_profile(get_profile(n, args.profiles_file), base) for n in names]]
    if adhoc is not None and args.profiles:
        raise UsageError("give --profiles NAMES or ad-hoc --profile/--rate/--delay values, not both")
    if adhoc is not None:
        return [[LinkModel.from_profile(adhoc, base)] * hops]
    names = [x.strip() for x in (args.profiles or "lan").split(",") if x.strip()]
    return [[LinkModel.from_profile(get_profile(n, args.profiles_file), base)] * hops for n in names]


def _format_table(df: pd.DataFrame) -> str:
    lines = [f"{'split':>8} {'cut':<22} {'frame':>10} {'latency ms':>11} {'img/s':>8}  bottleneck  front"]
    for _, r in df.iterrows():
        lines.append(f"{r['split']:>8} {r['cut'][:22]:<22} {r['frame_bytes']:>10} {r['predicted_latency_s'] * 1e3:>11.2f} "
                     f"{r['predicted_throughput_imgs_per_s']:>8.2f}  {r['predicted_bottleneck']:<10}  "
                     f"{'*' if r['on_front'] else ''}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    from .cli import HelpFormatter, add_common_flags, add_link_flags, example_epilog

    p = argparse.ArgumentParser(
        prog="python -m paretopipe.predict", formatter_class=HelpFormatter,
        description="Predict latency and throughput of every split from per-device profiles "
                    "(python -m paretopipe.profile), under link profiles or ad-hoc values; draw the optimal "
                    "split versus bandwidth; plan N-device chains; validate against a measured sweep.",
        epilog=example_epilog(
            "python -m paretopipe.predict --model mobilenetv2 --stage-profiles edge.json,server.json --profiles lte,wifi",
            "python -m paretopipe.predict --model mobilenetv2 --stage-profiles edge.json,server.json --rate 10mbit --delay 20ms",
            "python -m paretopipe.predict --model mobilenetv2 --stage-profiles edge.json,server.json --sweep-rate 1mbit..1gbit --delay 20ms",
            "python -m paretopipe.predict --model resnet18 --stage-profiles pi1.json,pi2.json,gpu.json --links wifi,lan",
            "python -m paretopipe.predict --model mobilenetv2 --stage-profiles s1.json,s2.json --validate results/"))
    p.add_argument("--model", required=True, help="the model the profiles were taken of")
    p.add_argument("--stage-profiles", required=True,
                   help="comma list of profile JSONs, one per device in chain order (device 1 holds the data); "
                        "a+b averages two profiles of one device, e.g. taken before and after a sweep")
    p.add_argument("--profiles", default=None, help="comma list of link profiles to evaluate (default lan)")
    p.add_argument("--links", default=None, help="N devices: one link profile per hop, e.g. wifi,lan")
    add_link_flags(p.add_argument_group("ad-hoc link (instead of --profiles)"))
    p.add_argument("--base-rate", default=None,
                   help="the network beneath the shaping: a rate such as 940mbit, or 'loopback' (default: this "
                        "host's loopback when all profiles come from one host, else unlimited)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--compression", default="none", choices=["none", "zstd", "lz4"])
    p.add_argument("--fine", action="store_true", help="every fx cut instead of the block splits")
    p.add_argument("--sweep-rate", default=None, help="draw the optimal split versus link rate over a range, e.g. 1mbit..1gbit")
    p.add_argument("--sweep-points", type=int, default=80)
    p.add_argument("--validate", default=None, metavar="RESULTS_DIR",
                   help="compare with a measured sweep; writes prediction_validation.* into its report/")
    p.add_argument("--out", default=None, help="folder for predictions.csv and figures (default: print only; "
                                               "--sweep-rate defaults to predictions/)")
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import setup_logging

    args = parser().parse_args(argv)
    setup_logging(args.debug, args.quiet)
    paths = [x.strip() for x in args.stage_profiles.split(",") if x.strip()]
    if len(paths) < 2:
        raise UsageError(f"--stage-profiles needs at least 2 profiles (one per device), got {len(paths)}")
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    profiles = [DeviceProfile.load_spec(path) for path in paths]
    if args.validate:
        if len(profiles) != 2:
            raise UsageError("--validate compares with a 2-stage TCP sweep: give exactly 2 stage profiles")
        table, summary = validate(args.validate, profiles, args.base_rate)
        out = Path(summary["session"]) / "report"
        written = write_validation(table, summary, out)
        ceiling = summary["run_to_run_jaccard_mean"]
        print(f"{summary['configurations']} configurations: median |error| latency "
              f"{summary['latency_median_ape']:.1%}, throughput {summary['throughput_median_ape']:.1%}; "
              f"front agreement (Jaccard) {summary['front_jaccard_mean']:.2f}"
              + (f" (the sweep's runs agree with each other at {ceiling:.2f})" if ceiling is not None else ""))
        for name, v in summary["per_profile"].items():
            rr = v.get("run_to_run_jaccard")
            print(f"  {name}: latency {v['latency_mape']:.1%}, throughput {v['throughput_mape']:.1%}, Jaccard "
                  f"{v['jaccard']:.2f} (measured front {v['measured_front']}, predicted {v['predicted_front']}"
                  + (f"; run to run {rr:.2f})" if rr is not None else ")"))
        print(f"goals (median error <= {GOAL_MAPE:.0%}, Jaccard >= {GOAL_JACCARD}): "
              f"{'met' if summary['goals_met'] else 'NOT met'}; written: {', '.join(str(p) for p in written)}")
        return 0
    for w in check_compatible(profiles, args.model):
        log.warning("%s", w)
    base = base_transport(profiles, args.base_rate)
    codec = codec_key(args.wire_dtype, args.compression)
    conditions = _links_for(args, base, len(profiles) - 1)
    out = Path(args.out) if args.out else None
    if len(profiles) > 2:
        return _print_plans(profiles, conditions, args, codec, out)
    if args.sweep_rate:
        if len(conditions) != 1:
            raise UsageError("--sweep-rate varies one link: give one --profile (its delay/jitter/loss are kept) "
                             "or ad-hoc --delay, not several --profiles")
        link = conditions[0][0]
        rates = parse_rate_range(args.sweep_rate, args.sweep_points)
        df = rate_map(profiles, link, rates, args.batch_size, codec, args.fine)
        out = out or Path("predictions")
        records.atomic_write_csv(out / "optimal_split_vs_rate.csv", df.to_dict("records"))
        order = [label for label, _ in split_positions(profiles[0], args.fine)]
        fig = plot_rate_map(df, out / "optimal_split_vs_rate.png",
                            f"{profiles[0].model}, batch {args.batch_size}, delay "
                            f"{link.delay_s * 1e3:g} ms: optimal split vs link rate", order)
        for column, what in (("best_latency_split", "latency"), ("best_throughput_split", "throughput")):
            print(f"{what}-optimal split by link rate:")
            for lo, hi, best in rate_ranges(df, column):
                print(f"  {lo:9.3g} .. {hi:<9.3g} Mbit/s  split {best}")
        print(f"written: {out / 'optimal_split_vs_rate.csv'}, {fig}")
        return 0
    tables = [predict_splits(profiles, links[0], args.batch_size, codec, args.fine) for links in conditions]
    for links, table in zip(conditions, tables):
        print(f"\n{profiles[0].model} on {profiles[0].name} -> {profiles[1].name}, link {links[0].name}, "
              f"batch {args.batch_size} (predicted; * = on the predicted front)")
        print(_format_table(table))
    if out:
        path = records.atomic_write_csv(out / "predictions.csv", pd.concat(tables).to_dict("records"))
        print(f"written: {path}")
    return 0


def _print_plans(profiles: Sequence[DeviceProfile], conditions: list[list[LinkModel]], args: argparse.Namespace,
                 codec: str, out: Path | None) -> int:
    positions = [b for _, b in split_positions(profiles[0], args.fine)]
    rows = []
    for links in conditions:
        plans = pareto_plans(profiles, links, args.batch_size, positions, codec)
        print(f"\n{profiles[0].model} over {' -> '.join(p.name for p in profiles)}, links "
              f"{', '.join(link.name for link in links)}: {len(plans)} Pareto-optimal plans (predicted)")
        print(f"{'--split-blocks':>16} {'latency ms':>11} {'img/s':>8}")
        for plan in plans:
            blocks = split_blocks(plan, profiles[0])
            print(f"{blocks:>16} {plan.latency_s * 1e3:>11.2f} {plan.throughput_imgs_per_s:>8.2f}")
            rows.append({"links": ",".join(link.name for link in links), "split_blocks": blocks,
                         "predicted_latency_s": plan.latency_s,
                         "predicted_throughput_imgs_per_s": plan.throughput_imgs_per_s})
    print(f"\nrun one with: python distributed_runner.py --local --world-size {len(profiles) + 1} "
          f"--num-partitions {len(profiles)} --model {args.model} --split-blocks <list>")
    if out:
        print(f"written: {records.atomic_write_csv(out / 'plans.csv', rows)}")
    return 0


if __name__ == "__main__":
    from .cli import run_cli

    raise SystemExit(run_cli(main))
