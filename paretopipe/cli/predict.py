"""``paretopipe predict`` (and ``python -m paretopipe.predict``): predictions from device profiles.

Every figure printed or written here is modelled (``predicted_*``), never measured; ``--validate``
says how far it is from a measurement.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Sequence

from ..options import flags
from ..errors import UsageError
from ..workload import GENERATION, IMAGES
from ..llm.shapes import shape_of, workload_of
from ..loadgen.settings import LoadgenOptions
from .workload_flags import LANGUAGE_MODELS, check_workload_flags
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog,
                     network_from_args, setup_logging)
from ..network.conditions import get_conditions
from ..predict import lm_costmodel
from ..predict.costmodel import LinkModel
from .. import records
from ..predict.device_profile import DeviceProfile, check_compatible, codec_key, resolve_cipher
from .subsets import print_generation_subsets, print_image_subsets
from ..predict.planner import pareto_plans, split_blocks

log = logging.getLogger("paretopipe.predict")


PROFILES_HELP = ("comma list of device profile JSONs, one per device in chain order (device 1 holds the data); a+b "
                 "averages two profiles of one device, e.g. taken before and after a sweep; sets separated by ';', "
                 "one per engine (profile --engine), compare the engines: "
                 "pi-torch.json,server-torch.json;pi-ort.json,server-ort.json")


def parser(prog: str = "python -m paretopipe.predict") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Predict latency and throughput of every split from device profiles (paretopipe profile), "
                    "under named network conditions or ad-hoc values; draw the optimal split versus bandwidth; "
                    "plan N-device chains; validate against a measured sweep.",
        epilog=example_epilog(
            "python -m paretopipe.predict --model mobilenetv2 --device-profiles edge.json,server.json --network lte,wifi",
            "python -m paretopipe.predict --model mobilenetv2 --device-profiles edge.json,server.json --rate 10mbit --delay 20ms",
            "python -m paretopipe.predict --model mobilenetv2 --device-profiles edge.json,server.json --sweep-rate 1mbit..1gbit --delay 20ms",
            "python -m paretopipe.predict --model resnet18 --device-profiles pi1.json,pi2.json,gpu.json --links wifi,lan",
            "python -m paretopipe.predict --model mobilenetv2 --device-profiles s1.json,s2.json --validate results/",
            "python -m paretopipe.predict --model tiny-lm --device-profiles cpu-tiny-lm.json,cpu-tiny-lm.json "
            "--network lan,3g --prompt-len 16"))
    flags.MODEL.add_to(p, default=None, help="the model the device profiles were taken of")
    flags.MODEL_DIR.add_to(p)
    flags.DEVICE_PROFILES.add_to(p, aliases=("--stage-profiles",), required=True,
                                 help=PROFILES_HELP)
    p.add_argument("--links", default=None, help="N devices: one named network condition per hop, e.g. wifi,lan")
    add_network_flags(p.add_argument_group("network conditions (default lan)"), many=True)
    p.add_argument("--base-rate", default=None,
                   help="the network beneath the shaping: a rate such as 940mbit, or 'loopback' (default: this "
                        "host's loopback when all device profiles come from one host, else unlimited)")
    flags.BATCH_SIZE.add_to(p, default=1)
    flags.WIRE_DTYPE.add_to(p)
    flags.COMPRESSION.add_to(p)
    flags.ENCRYPT.add_to(p, help="predict a sealed data port: each device's measured seal and open times (paretopipe "
                        "profile --ciphers) join its frames' encode and decode; auto picks as the stages would")
    flags.FINE.add_to(p)
    flags.OBJECTIVES.add_to(p, help="the predicted front's objectives, two or more of latency, throughput, memory (each stage's "
                        "parameters plus its largest activation, from the profiles), memory_stageN, energy "
                        "(modelled: needs --power-core-w); default latency,throughput")
    flags.POWER_CORE_W.add_to(p, help="per device, e.g. 0.9,15: the watts one busy core adds; x each stage's "
                                      "predicted compute = its modelled energy per image")
    flags.LATENCY_BOUND_MS.add_to(p, default=None, help="also predict each split's MLPerf Server rate: the highest "
                                  "Poisson rate whose 99th-percentile latency stays within this bound, ms (queueing at "
                                  "the bottleneck stage or link)")
    p.add_argument("--subsets", action="store_true",
                   help="which devices to use: every subset and order of the profiles after the first (the data "
                        "source) priced, and per objective what each extra device buys or costs")
    p.add_argument("--sweep-rate", default=None, help="draw the optimal split versus link rate over a range, e.g. 1mbit..1gbit")
    p.add_argument("--sweep-points", type=int, default=80)
    p.add_argument("--validate", default=None, metavar="RESULTS_DIR",
                   help="compare with a measured sweep; writes prediction_validation.* into its report/ (a language "
                        "model's --subsets: sessions, comma-separated, measured on --env-file's hosts)")
    flags.ENV_FILE.add_to(p, help="with --subsets --validate: the .env whose HOSTS are the profiled devices, in the "
                                  "profiles' order (a session's plan of m stages ran on its first m hosts)")
    lm = p.add_argument_group(f"{LANGUAGE_MODELS}: time to first token and per token")
    flags.PROMPT_LENS.add_to(lm)
    flags.TTFT_MS.add_to(lm, help="also predict each split's MLPerf Server rate: the highest Poisson rate of "
                         "queries (one prompt, --gen-tokens tokens) whose p99 time to first token stays within this "
                         "bound, ms, while the time per token stays within --tpot-ms")
    flags.TPOT_MS.add_to(lm)
    flags.GEN_TOKENS.add_to(lm)
    flags.STREAMS.add_to(lm)
    flags.OUT.add_to(p, help="folder for predictions.csv and figures (default: print only; "
                                               "--sweep-rate defaults to predictions/)")
    add_common_flags(p)
    return p


def _links_for(args: argparse.Namespace, base: dict[str, Any], hops: int) -> list[list[tuple[Any, Any]]]:
    """One list of (up, down) hop links per network condition to evaluate."""
    names = [x.strip() for x in (args.network or "").split(",") if x.strip()]
    if args.links:
        hop_names = [x.strip() for x in args.links.split(",") if x.strip()]
        if len(hop_names) != hops:
            raise UsageError(f"--links {args.links!r}: {hops + 1} devices need {hops} links, one network each")
        return [[LinkModel.pair(get_conditions(n, args.network_file), base) for n in hop_names]]
    if len(names) > 1:
        return [[LinkModel.pair(get_conditions(n, args.network_file), base)] * hops for n in names]
    conditions = network_from_args(args) or get_conditions("lan", args.network_file)
    return [[LinkModel.pair(conditions, base)] * hops]


def _format_table(df) -> str:
    memory = "predicted_memory_bytes" in df.columns
    energy = "predicted_energy_modelled_per_image_j" in df.columns
    server = "predicted_server_qps" in df.columns
    lines = [f"{'split':>8} {'cut':<22} {'frame':>10} {'latency ms':>11} {'img/s':>8}"
             + (f" {'memory MiB':>10}" if memory else "") + (f" {'J/img (modelled)':>16}" if energy else "")
             + (f" {'server q/s':>10} {'capacity':>8}" if server else "") + "  bottleneck  front"]
    for _, r in df.iterrows():
        lines.append(f"{r['split']:>8} {r['cut'][:22]:<22} {r['frame_bytes']:>10} {r['predicted_latency_s'] * 1e3:>11.2f} "
                     f"{r['predicted_throughput_imgs_per_s']:>8.2f}"
                     + (f" {r['predicted_memory_bytes'] / 2**20:>10.1f}" if memory else "")
                     + (f" {r['predicted_energy_modelled_per_image_j']:>16.4g}" if energy else "")
                     + (f" {r['predicted_server_qps']:>10.2f} {r['predicted_server_capacity_qps']:>8.2f}" if server else "")
                     + f"  {r['predicted_bottleneck']:<10}  {'*' if r['on_front'] else ''}")
    return "\n".join(lines)


def _per_device_watts(values: list[float | None] | None, devices: int) -> list[float | None] | None:
    if values is not None and len(values) != devices:
        shown = ",".join("" if v is None else f"{v:g}" for v in values)
        raise UsageError(f"--power-core-w {shown!r}: give one value of 0 or more watts per device ({devices})")
    return values


#: Options that only one kind of model's prediction takes (their dests).
IMAGE_ONLY = ("links", "base_rate", "batch_size", "compression", "encrypt", "fine", "objectives", "power_core_w",
              "latency_bound_ms", "sweep_rate")
GENERATION_ONLY = ("prompt_len", "ttft_ms", "tpot_ms", "gen_tokens", "streams")


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.predict") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.model is None and args.model_dir is None:
        raise UsageError("give --model NAME (or --model-dir DIR for a language model's folder)")
    if args.wire_dtype == "auto":
        raise UsageError("--wire-dtype auto is chosen per cut at run time from measured fidelity; predict prices "
                         "a named dtype: valid float32, float16, bfloat16, int8, int4")
    kind = workload_of(args.model, args.model_dir)
    check_workload_flags(p, args, kind, {IMAGES.name: IMAGE_ONLY, GENERATION.name: GENERATION_ONLY})
    return {IMAGES: _predict_image_model, GENERATION: _predict_language_model}[kind](args)


def _predict_language_model(args: argparse.Namespace) -> int:
    """Every split's time to first token and per token under each network and prompt length, from
    two device profiles (each block's compute per phase); ``--validate`` pairs a sweep's measurements."""
    shape = shape_of(args.model, args.model_dir)
    paths = [p.strip() for p in args.device_profiles.split(",") if p.strip()]
    profiles = [lm_costmodel.load_profile(p) for p in paths]
    networks = [n.strip() for n in (args.network or "lan").split(",") if n.strip()]
    if args.subsets:  # each device by its profile's file name
        return print_generation_subsets(shape, profiles, [Path(p).stem for p in paths], networks, args)
    # The Server's token bounds, where asked for (one given, the other MLPerf's default, as a run's).
    server = None if args.ttft_ms is None and args.tpot_ms is None else LoadgenOptions(
        "server", ttft_bound_s=None if args.ttft_ms is None else args.ttft_ms / 1e3,
        tpot_bound_s=None if args.tpot_ms is None else args.tpot_ms / 1e3).for_tokens()
    rows = []
    for name in networks:
        conditions = None if name == "unshaped" else get_conditions(name, args.network_file)
        for plen in args.prompt_len:
            predicted = lm_costmodel.predict(shape, profiles, conditions, plen, args.wire_dtype)
            if server is not None:
                for row in predicted:
                    row.update(lm_costmodel.server_columns(row, conditions, args.gen_tokens, args.streams,
                                                           server.ttft_bound_s, server.tpot_bound_s))
            rows += predicted
    print(lm_costmodel.table(rows))
    result: dict[str, Any] = {"predictions": rows}
    if args.validate:
        # lazy for start-up: pandas
        from ..analysis.session import find_session

        session = find_session(args.validate)
        check = lm_costmodel.validate(rows, session.configs())
        result["validation"] = check
        print(f"validation against {session.path}: {check['configurations']} configurations, median |error| time "
              f"to first token {check['ttft_median_abs_error']:.1%}, time per token {check['tpot_median_abs_error']:.1%}")
    if args.out:
        print(f"written: {records.atomic_write_json(Path(args.out) / 'predictions.json', result)}")
        print(f"written: {records.atomic_write_csv(Path(args.out) / 'predictions.csv', rows)}")
    return 0


def _predict_image_model(args: argparse.Namespace) -> int:
    import pandas as pd

    # lazy for start-up: pandas
    from ..predict.predictions import base_transport, predict_splits

    if ";" in args.device_profiles and not args.validate:
        return _compare_engines(args)
    paths = [x.strip() for x in args.device_profiles.split(",") if x.strip()]
    if len(paths) < 2:
        raise UsageError(f"--device-profiles needs at least 2 device profiles (one per device), got {len(paths)}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1")
    profiles = [DeviceProfile.load_spec(path) for path in paths]
    if args.validate:
        return _validate(args, profiles)
    for w in check_compatible(profiles, args.model):
        log.warning("%s", w)
    base = base_transport(profiles, args.base_rate)
    codec = codec_key(args.wire_dtype, args.compression, resolve_cipher(args.encrypt, profiles))
    conditions = _links_for(args, base, len(profiles) - 1)
    out = Path(args.out) if args.out else None
    if args.subsets:
        return print_image_subsets(profiles, conditions, args, codec, out)
    if len(profiles) > 2:
        return _print_plans(profiles, conditions, args, codec, out)
    if args.sweep_rate:
        return _print_rate_map(profiles, conditions, args, codec, out)
    power = _per_device_watts(args.power_core_w, len(profiles))
    tables = [predict_splits(profiles, links[0][0], args.batch_size, codec, args.fine, links[0][1],
                             objectives=args.objectives, power_core_w=power,
                             latency_bound_s=args.latency_bound_ms / 1e3 if args.latency_bound_ms else None)
              for links in conditions]
    for links, table in zip(conditions, tables):
        bound = (f"; server q/s: the Poisson rate within p99 {args.latency_bound_ms:g} ms, queries of one sample"
                 if args.latency_bound_ms else "")
        print(f"\n{profiles[0].model} on {profiles[0].name} -> {profiles[1].name}, network {links[0][0].name}, "
              f"batch {args.batch_size} (predicted; * = on the predicted front{bound})")
        print(_format_table(table))
    if out:
        path = records.atomic_write_csv(out / "predictions.csv", pd.concat(tables).to_dict("records"))
        print(f"written: {path}")
    return 0


def _validate(args: argparse.Namespace, profiles: list) -> int:
    """``--validate``: predict a measured sweep's configurations and print how far off each front is."""
    # lazy for start-up: pandas
    from ..predict.validate import (GOAL_JACCARD, GOAL_MAPE, epsilon_jaccard_words, kept_line, validate,
                                    write_validation)

    if len(profiles) != 2:
        raise UsageError("--validate compares with a 2-stage TCP sweep: give exactly 2 device profiles")
    table, summary = validate(args.validate, profiles, args.base_rate)
    out = Path(summary["session"]) / "report"
    written = write_validation(table, summary, out)
    print(f"{summary['configurations']} configurations: median |error| latency "
          f"{summary['latency_median_ape']:.1%}, throughput {summary['throughput_median_ape']:.1%}; fronts compared "
          f"within the measured noise (epsilon-fronts: a split is dominated only by one better by more than the "
          f"front's median 95% half-width on one objective and no worse, beyond it, on any)")
    for name, v in summary["per_network"].items():
        rr = v.get("run_to_run_jaccard")
        eps = ", ".join(f"{col.split('_')[0]} {e:.1%}" for col, e in v["epsilon"].items())
        print(f"  {name}: latency {v['latency_mape']:.1%}, throughput {v['throughput_mape']:.1%}; epsilon ({eps}) "
              f"Jaccard {v['jaccard']:.2f} (measured {v['measured_epsilon_front']}, predicted "
              f"{v['predicted_epsilon_front']}); strict Jaccard {v['strict_jaccard']:.2f} (measured "
              f"{v['measured_front']}, predicted {v['predicted_front']})"
              + (f"; beyond the noise: {v['beyond_noise']}" if v["beyond_noise"] else "")
              + (f"; the sweep against itself {rr:.2f}" if rr is not None else ""))
        kept = kept_line(table, name)
        if kept:
            print(f"    {kept}")
    for name, rr in summary["unjudged_fronts"].items():
        print(f"  not judged: {name}: the sweep agrees with itself on this epsilon-front at only {rr:.2f} (< "
              f"{GOAL_JACCARD}; its front against those of its own runs resampled): its best splits lie within "
              f"the noise of each other, so this measurement does not rank them and no prediction can be held "
              f"to one ranking")
    print(f"goals (median error <= {GOAL_MAPE:.0%}, epsilon-front Jaccard >= {GOAL_JACCARD} on the fronts the sweep "
          f"reproduces; {epsilon_jaccard_words(summary)}): {'met' if summary['goals_met'] else 'NOT met'}; "
          f"written: {', '.join(str(p) for p in written)}")
    return 0


def _print_rate_map(profiles: list, conditions: list, args: argparse.Namespace, codec: str, out: Path | None) -> int:
    """``--sweep-rate``: the optimal split of one link over a range of its rates, as a table and a map."""
    # lazy for start-up: pandas
    from ..predict.predictions import parse_rate_range, plot_rate_map, rate_map, rate_ranges, split_positions

    if len(conditions) != 1:
        raise UsageError("--sweep-rate varies one link: give one --network (its delay/jitter/loss are kept) "
                         "or ad-hoc --delay, not several")
    up, down = conditions[0][0]
    rates = parse_rate_range(args.sweep_rate, args.sweep_points)
    df = rate_map(profiles, up, rates, args.batch_size, codec, args.fine, down)
    out = out or Path("predictions")
    records.atomic_write_csv(out / "optimal_split_vs_rate.csv", df.to_dict("records"))
    order = [label for label, _ in split_positions(profiles[0], args.fine)]
    fig = plot_rate_map(df, out / "optimal_split_vs_rate.png",
                        f"{profiles[0].model}, batch {args.batch_size}, delay "
                        f"{up.direction.delay_s * 1e3:g} ms: optimal split vs link rate", order)
    for column, what in (("best_latency_split", "latency"), ("best_throughput_split", "throughput")):
        print(f"{what}-optimal split by link rate:")
        for lo, hi, best in rate_ranges(df, column):
            print(f"  {lo:9.3g} .. {hi:<9.3g} Mbit/s  split {best}")
    print(f"written: {out / 'optimal_split_vs_rate.csv'}, {fig}")
    return 0


def _print_plans(profiles, conditions, args: argparse.Namespace, codec: str, out: Path | None) -> int:
    # lazy for start-up: pandas
    from ..predict.predictions import split_positions

    positions = [b for _, b in split_positions(profiles[0], args.fine)]
    rows = []
    for links in conditions:
        ups, downs = [u for u, _ in links], [d for _, d in links]
        plans = pareto_plans(profiles, ups, args.batch_size, positions, codec, downs)
        print(f"\n{profiles[0].model} over {' -> '.join(p.name for p in profiles)}, links "
              f"{', '.join(link.name for link in ups)}: {len(plans)} Pareto-optimal plans (predicted)")
        print(f"{'--split-blocks':>16} {'latency ms':>11} {'img/s':>8}")
        for plan in plans:
            blocks = split_blocks(plan, profiles[0])
            print(f"{blocks:>16} {plan.latency_s * 1e3:>11.2f} {plan.throughput_imgs_per_s:>8.2f}")
            rows.append({"links": ",".join(link.name for link in ups), "split_blocks": blocks,
                         "predicted_latency_s": plan.latency_s,
                         "predicted_throughput_imgs_per_s": plan.throughput_imgs_per_s})
    print(f"\nrun one with: python distributed_runner.py --local --world-size {len(profiles) + 1} "
          f"--num-partitions {len(profiles)} --model {args.model} --split-blocks <list>")
    if out:
        print(f"written: {records.atomic_write_csv(out / 'plans.csv', rows)}")
    return 0




def _compare_engines(args: argparse.Namespace) -> int:
    """One set of two device profiles per engine: per network, each engine's splits on one front,
    and which engine and split win there."""
    import pandas as pd

    # lazy for start-up: pandas
    from ..predict.predictions import base_transport, engines_front

    sets = [[DeviceProfile.load_spec(x.strip()) for x in part.split(",") if x.strip()]
            for part in args.device_profiles.split(";") if part.strip()]
    if any(len(profiles) != 2 for profiles in sets):
        raise UsageError("--device-profiles A,B;C,D compares engines on two devices: give two profiles per set, "
                         "one set per engine")
    for w in check_compatible([p for profiles in sets for p in profiles], args.model):
        log.warning("%s", w)
    codec = codec_key(args.wire_dtype, args.compression, resolve_cipher(args.encrypt, sets[0]))
    tables = []
    for links in _links_for(args, base_transport(sets[0], args.base_rate), 1):
        table = engines_front(sets, links[0][0], args.batch_size, codec, links[0][1])
        tables.append(table)
        best = table.loc[table["predicted_latency_s"].idxmin()]
        print(f"\n{sets[0][0].model}, network {links[0][0].name}, batch {args.batch_size}: the front over "
              f"{', '.join(dict.fromkeys(table['engine']))} (predicted; best latency: {best['engine']} at split "
              f"{best['split']}, {best['predicted_latency_s'] * 1e3:.2f} ms)")
        for engine, rows in table.groupby("engine", sort=False):
            front = rows[rows["on_front"]]
            print(f"  {engine:<18} on the front: {' '.join(front['split']) or 'none'}; its own best latency at split "
                  f"{rows.loc[rows['predicted_latency_s'].idxmin(), 'split']}")
    if args.out:
        path = records.atomic_write_csv(Path(args.out) / "predictions.csv", pd.concat(tables).to_dict("records"))
        print(f"written: {path}")
    return 0
