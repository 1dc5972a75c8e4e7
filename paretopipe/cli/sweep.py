"""``automated_split_tester.py`` and ``paretopipe sweep``: every split under every named network condition."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from .. import cpushare
from ..errors import UsageError
from ..runners.hosts import Testbed
from ..runners.processes import check_stage_devices
from ..runners.sweep import SweepOptions, Sweeper, describe_plan, parse_plans, session_dir
from ..network import traces
from ..transport import aead
from ..transport.auth import load_secret
from . import experiment
from .report import add_objectives_flag, print_front_table, print_privacy_cost
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_dataset_flags, add_prefetch_flags,
                     dataset_from_args, prefetch_from_args,
                     example_epilog, nonneg_float, percent, nonneg_int, positive_float,
                     positive_int, read_env, setup_logging)

log = logging.getLogger("paretopipe.sweep")


def parser(prog: str = "automated_split_tester.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Run every split point of a model under every named network condition, collect the run "
                    "records, consolidate them (runs.csv, summary.csv, failures.csv, session.json) and write "
                    "the Pareto report. Local (every stage on this machine) unless .env names hosts.",
        epilog=example_epilog(
            "python automated_split_tester.py --model mobilenetv2 --splits all --runs 3 --network lan,wifi,lte",
            "python automated_split_tester.py --models resnet18,resnet50 --splits 1-8 --in-flight 4",
            "python automated_split_tester.py --model resnet18 --backend rpc --split-blocks 3,6;2,7 --network wifi",
            "python automated_split_tester.py --model mobilenetv2 --dry-run",
            "python automated_split_tester.py --model mobilenetv2 --resume --out results",
            "paretopipe sweep --config examples/demo.toml",
            "paretopipe sweep --rerun results/20261122-091500   # the same experiment again, a new session"))
    w = p.add_argument_group("what to sweep")
    w.add_argument("--model", default=None, help="one model (mobilenetv2 when neither --model nor --models is given)")
    w.add_argument("--models", default=None, help="comma list of models")
    w.add_argument("--splits", default="all",
                   help="all, a list 1,4,8, or ranges 2-10 (0 and K are the baselines); add adaptive for the "
                        "runtime that picks the split per batch from the measured link (all,adaptive)")
    w.add_argument("--split-blocks", default=None,
                   help="N-stage plans for the rpc backend, ';' between plans: 3,9;5,12 (as paretopipe predict prints them)")
    w.add_argument("--runs", type=positive_int, default=3, help="repetitions per configuration")
    w.add_argument("--network", "--networks", "--profiles", dest="network", default=None,
                   help="comma list of named network conditions from profiles.toml (--profiles is the anchor's "
                        "name); default lan, or only the trace with --trace")
    w.add_argument("--network-file", "--profiles-file", dest="network_file", default=None,
                   help="a TOML file of named network conditions (the shipped profiles.toml when not given)")
    w.add_argument("--trace", default=None,
                   help="a rate trace (Mahimahi or time_s,rate_mbit CSV) for both directions: adds a network named "
                        "trace-<file stem> to --network (per-direction traces: trace_up/trace_down in a network file)")
    w.add_argument("--backend", default="tcp", choices=["tcp", "rpc", "both"])
    w.add_argument("--num-classes", type=positive_int, default=10)
    w.add_argument("--weights", default=None, help="state-dict .pth every stage loads (it must exist on every host)")
    q = p.add_argument_group("order and repetitions")
    q.add_argument("--order", default="random", choices=["random", "sequential"],
                   help="random: seeded rounds, each configuration once per round in a new order, so drift "
                        "spreads over every split; sequential: every run of a configuration back to back, splits "
                        "in order (the anchor's)")
    q.add_argument("--seed", type=nonneg_int, default=0, help="seed of the random order (recorded in the session)")
    q.add_argument("--precision", type=percent, default=None,
                   help="keep measuring each configuration, in further rounds, until the 95%% CIs of its median "
                        "latency and its throughput are within +-this (e.g. 5%%), or --max-runs is spent")
    q.add_argument("--max-runs", type=positive_int, default=None,
                   help="per-configuration budget of runs with --precision (3 x --runs when not given)")
    q.add_argument("--drift-every", type=nonneg_float, default=60.0,
                   help="re-measure a reference configuration this often, seconds (0: never; random order only); "
                        "runs measured during a drift are measured again")
    r = p.add_argument_group("each run")
    r.add_argument("--batch-size", type=positive_int, default=8)
    r.add_argument("--num-batches", type=positive_int, default=20, help="measured batches per run")
    r.add_argument("--warmup", type=nonneg_int, default=3,
                   help="warm-up batches on a cut's first run in each worker group (later runs of that cut skip "
                        "them: its one-time costs are paid; the record's config.warmup says which)")
    r.add_argument("--warmup-every-run", action="store_true",
                   help="warm up before every run, as separate processes per run would have to")
    r.add_argument("--in-flight", type=positive_int, default=1, help="pipelining window")
    r.add_argument("--wire-dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    r.add_argument("--compression", default="none", choices=["none", "zstd", "lz4"])
    r.add_argument("--encrypt", default="none",
                   help=f"comma list of the TCP data port's ciphers to sweep ({', '.join(aead.CHOICES)}), e.g. "
                        "none,aesgcm: each is a configuration of its own (AEAD, keys from PARETOPIPE_SECRET), with "
                        "its cipher and seal and open times recorded, so the report shows what privacy costs at "
                        "every split")
    add_dataset_flags(r, default="auto")
    add_prefetch_flags(r)
    r.add_argument("--link", default=None, choices=["emulated", "tc", "none"],
                   help="emulated (the local choice): in-process link; tc: qdiscs on the hosts' IFACE (the "
                        "choice with hosts); none")
    r.add_argument("--objective", default="latency", choices=["latency", "throughput"],
                   help="what the adaptive split optimises")
    r.add_argument("--deadline-ms", type=positive_float, default=None,
                   help="adaptive split: a result later than this is finished on stage 1 instead")
    r.add_argument("--rpc-source", default="master", choices=["master", "stage1"],
                   help="where the rpc backend's data lives: a master rank of its own, or stage 1")
    r.add_argument("--rpc-transport", default="uv", choices=["uv", "auto"])
    m = p.add_argument_group("energy, memory and the fronts' objectives")
    add_objectives_flag(m)
    m.add_argument("--energy-rate-hz", type=positive_float, default=10.0,
                   help="how often each stage reads its host's power sensors (RAPL, NVML, a Pi 5's PMIC, INA2xx)")
    m.add_argument("--power-idle-w", default=None,
                   help="per stage, e.g. 2.7,45: a device's idle watts, for the modelled energy of a host without "
                        "sensors (else POWER_IDLE_W per host in .env)")
    m.add_argument("--power-core-w", default=None,
                   help="per stage, e.g. 0.9,15: the watts one busy core adds, x the stage's CPU seconds = its "
                        "modelled energy (else POWER_CORE_W per host in .env)")
    m.add_argument("--memory-limit", default=None,
                   help="stage1=1GiB or one size per stage (1GiB,16GiB): a stage whose peak memory exceeds it is "
                        "marked in the records and the report (else MEMORY_LIMITS per host in .env)")
    s = p.add_argument_group("where")
    s.add_argument("--env-file", default=".env", help="hosts, SSH settings and the shared secret (see .env.example)")
    s.add_argument("--local", action="store_true", help="ignore hosts in .env and run every stage here")
    s.add_argument("--hosts-required", action="store_true",
                   help="refuse to run locally: .env must name the hosts (partition.sh's mode)")
    s.add_argument("--iface", default=None, help="with --link tc: interface to shape (IFACE from .env otherwise)")
    s.add_argument("--stage-devices", default=None,
                   help="device per stage, e.g. cpu,cuda (with hosts: overrides DEVICES/PI1_DEVICE/GPU_DEVICE)")
    s.add_argument("--threads", type=positive_int, default=None, help="torch threads per stage (cores / stages otherwise)")
    s.add_argument("--stage-threads", default=None, help="torch threads per stage, e.g. 1,2 (overrides --threads)")
    s.add_argument("--stage-cpu", default=None,
                   help="CPU share per stage via cgroup quota, e.g. 0.25,1 (an edge device and a server on one "
                        "machine; local TCP only)")
    s.add_argument("--no-optimizations", action="store_true",
                   help="do not pin stages to separate cores (the anchor's behaviour; for comparisons)")
    e = p.add_argument_group("experiment files")
    e.add_argument("--config", default=None,
                   help="experiment TOML file ([sweep] options named as these flags, [networks.NAME], [hosts]); "
                        "flags given here override it")
    e.add_argument("--rerun", default=None, metavar="SESSION",
                   help="repeat a session's stored experiment (SESSION/experiment.toml) as a new session")
    e.add_argument("--force-resume", action="store_true",
                   help="let --resume continue a session with options that differ from its stored experiment")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="results", help="results folder; each sweep is a session inside it")
    o.add_argument("--session", default=None, help="session folder name (a timestamp when not given)")
    o.add_argument("--resume", action="store_true", help="continue the newest (or --session) session, skipping completed runs")
    o.add_argument("--cleanup", action="store_true", help="delete per-run JSONs after consolidation (CSVs stay)")
    o.add_argument("--no-report", action="store_true", help="skip the Pareto report at the end")
    o.add_argument("--wait-time", type=positive_float, default=120.0, help="readiness timeout for stage processes, seconds")
    o.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds a run may wait for progress (default: follows the link: 60 s plus what the batches "
                        "in flight need at its slowest rate, with delay, jitter, losses and measured compute)")
    o.add_argument("--max-batch-s", type=positive_float, default=None,
                   help="a batch slower than this (seconds, end to end) makes its configuration infeasible: recorded "
                        "as such, drawn as dominated, and the sweep goes on")
    o.add_argument("--dry-run", action="store_true", help="print the plan and its size; run nothing")
    o.add_argument("--check", action="store_true", help="check every host (paretopipe doctor) before the sweep")
    add_common_flags(p)
    return p


def _per_stage_ints(text: str | None, flag: str) -> list[int | None]:
    if not text:
        return [None, None]
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) < 2 or min(values) < 1:
        raise UsageError(f"{flag} {text!r}: give one positive integer per stage, e.g. 1,2")
    return values


def options_from_args(args: argparse.Namespace, exp: experiment.Experiment | None = None) -> SweepOptions:
    from ..partition.names import canonical_name

    models = [m.strip() for m in (args.models or args.model or "mobilenetv2").split(",") if m.strip()]
    if not models:
        raise UsageError("--models names no model")
    for model in models:  # here, before any host is asked to build it
        canonical_name(model)
    devices = [d.strip() for d in args.stage_devices.split(",")] if args.stage_devices else []
    env = read_env(args.env_file)
    if args.local:
        testbed = Testbed()
    elif exp is not None and exp.hosts:
        testbed = Testbed.from_table(exp.hosts, env, devices or None)
    else:
        testbed = Testbed.from_env(env, devices or None)
    if args.hosts_required and not testbed.remote:
        raise UsageError(f"set PI1_IP and PI2_IP (or GPU_IP), or HOSTS, in {args.env_file} or the environment "
                         f"(see .env.example)")
    if args.local:
        testbed.secret = env.get("PARETOPIPE_SECRET") or None
        load_secret(testbed.secret or "")
    if args.iface:
        testbed.iface = args.iface
        for h in testbed.hosts:
            h.iface = args.iface
    if not testbed.remote and any(d.startswith("cuda") for d in devices):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--stage-devices {args.stage_devices}: CUDA is not available on this machine; "
                             f"valid here: cpu")
    plans = parse_plans(args.split_blocks) if args.split_blocks else None
    stages = (len(plans[0]) + 1) if plans else 2
    link = args.link or ("tc" if testbed.remote else "emulated")
    backends = ["tcp", "rpc"] if args.backend == "both" else [args.backend]
    default_network = None if args.trace else "lan"
    networks = [x.strip() for x in (args.network or default_network or "").split(",") if x.strip()]
    inline = dict(exp.networks) if exp else {}
    if args.trace:
        trace = Path(args.trace).expanduser().resolve()
        traces.load(trace)  # a bad trace is one line now, not a failure in every worker
        name = f"trace-{trace.stem}"
        inline[name] = {"trace": str(trace)}
        networks.append(name)
    return SweepOptions(models=models, splits=args.splits, plans=plans, runs=args.runs,
                        networks=networks, backends=backends,
                        batch_size=args.batch_size, num_batches=args.num_batches, warmup=args.warmup,
                        warmup_every_run=args.warmup_every_run,
                        in_flight=args.in_flight, link=link, out=args.out, session=args.session,
                        resume=args.resume, wait_time=args.wait_time, timeout=args.timeout,
                        max_batch_s=args.max_batch_s, threads=args.threads,
                        prefetch_batches=prefetch_from_args(args),
                        optimizations=not args.no_optimizations, dry_run=args.dry_run, cleanup=args.cleanup,
                        report=not args.no_report, testbed=testbed, network_file=args.network_file,
                        wire_dtype=args.wire_dtype, compression=args.compression,
                        ciphers=_ciphers(args.encrypt, backends, testbed),
                        stage_cpu=cpushare.parse_shares(args.stage_cpu, 2),
                        stage_threads=_per_stage_ints(args.stage_threads, "--stage-threads"),
                        stage_devices=check_stage_devices(devices, stages) if not testbed.remote else [],
                        rpc_source=args.rpc_source, rpc_transport=args.rpc_transport,
                        num_classes=args.num_classes, weights=args.weights,
                        dataset=dataset_from_args(args, args.compression, local=not testbed.remote),
                        data_dir=args.data_dir, inline_networks=inline, order=args.order,
                        seed=args.seed, precision=args.precision, max_runs=args.max_runs,
                        drift_every_s=args.drift_every, objective=args.objective, objectives=args.objectives,
                        energy_rate_hz=args.energy_rate_hz,
                        power_idle_w=_per_stage_floats(args.power_idle_w, "--power-idle-w", stages),
                        power_core_w=_per_stage_floats(args.power_core_w, "--power-core-w", stages),
                        memory_limits=_memory_limits(args.memory_limit, stages),
                        deadline_s=args.deadline_ms / 1e3 if args.deadline_ms else None)


def _per_stage_floats(text: str | None, flag: str, stages: int) -> list[float | None]:
    """``2.7,45`` (an empty entry: that stage's host decides) as watts per stage."""
    if not text:
        return []
    values: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part) if part else None
        except ValueError:
            raise UsageError(f"{flag} {text!r}: give watts per stage, e.g. 2.7,45")
        if value is not None and not 0 <= value < float("inf"):
            raise UsageError(f"{flag} {text!r}: watts must be 0 or more")
        values.append(value)
    if len(values) != stages:
        raise UsageError(f"{flag} {text!r}: give one value per stage ({stages})")
    return values


def _memory_limits(text: str | None, stages: int) -> list[int | None]:
    from ..energy.memory import parse_limits

    limits = parse_limits(text, stages)
    return [limits.get(f"stage{j}") for j in range(1, stages + 1)] if limits else []


def _ciphers(text: str, backends: list[str], testbed: Testbed) -> list[str]:
    """--encrypt's list, refused where it cannot apply: without a shared secret, or with the rpc
    backend alone (with --backend both the rpc runs stay plain)."""
    choices = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if not choices:
        raise UsageError(f"--encrypt {text!r} names no cipher; valid: {', '.join(aead.CHOICES)}")
    secret = load_secret(testbed.secret or "")
    for choice in choices:
        aead.check_choice(choice, secret)
    sealed = [c for c in choices if c != "none"]
    if sealed and "tcp" not in backends:
        raise UsageError(f"--encrypt {sealed[0]} seals the TCP data port; the rpc backend's TensorPipe channel "
                         f"cannot be sealed: use --backend tcp (or both, where the rpc runs stay plain)")
    return choices


def resolved_table(opts: SweepOptions) -> dict[str, Any]:
    """The ``[sweep]`` table of a session's experiment.toml: every option as it was resolved."""
    def joined(values: list) -> str | None:
        return ",".join("" if v is None else str(v) for v in values) if any(v is not None for v in values) else None

    return {"models": list(opts.models), "splits": opts.splits,
            "split_blocks": [list(p) for p in opts.plans] if opts.plans else None, "runs": opts.runs,
            "networks": list(opts.networks), "backend": "both" if len(opts.backends) == 2 else opts.backends[0],
            "batch_size": opts.batch_size, "num_batches": opts.num_batches, "warmup": opts.warmup,
            "warmup_every_run": opts.warmup_every_run,
            "in_flight": opts.in_flight, "wire_dtype": opts.wire_dtype, "compression": opts.compression,
            "encrypt": list(opts.ciphers) if opts.ciphers != ["none"] else None,
            "dataset": opts.dataset, "data_dir": opts.data_dir, "link": opts.link, "num_classes": opts.num_classes,
            "weights": opts.weights, "rpc_source": opts.rpc_source, "rpc_transport": opts.rpc_transport,
            "threads": opts.threads, "stage_threads": joined(opts.stage_threads),
            "stage_cpu": joined(opts.stage_cpu), "stage_devices": joined(opts.stage_devices),
            "no_optimizations": not opts.optimizations, "timeout": opts.timeout, "max_batch_s": opts.max_batch_s,
            "prefetch_batches": opts.prefetch_batches, "wait_time": opts.wait_time,
            "local": not opts.testbed.remote, "order": opts.order, "seed": opts.seed,
            "precision": None if opts.precision is None else f"{opts.precision * 100:g}%", "max_runs": opts.max_runs,
            "drift_every": opts.drift_every_s, "objective": opts.objective, "objectives": opts.objectives,
            "energy_rate_hz": opts.energy_rate_hz if opts.energy_rate_hz != 10.0 else None,
            "power_idle_w": joined(opts.power_idle_w), "power_core_w": joined(opts.power_core_w),
            "memory_limit": joined(opts.memory_limits),
            "deadline_ms": None if opts.deadline_s is None else opts.deadline_s * 1e3}


def _experiment_of(p: ArgumentParser, args: argparse.Namespace) -> experiment.Experiment | None:
    """What --config, --rerun or --resume contributes (a resumed session's own stored experiment)."""
    given = [flag for flag, value in (("--config", args.config), ("--rerun", args.rerun)) if value]
    if len(given) > 1 or (given and args.resume and args.rerun):
        raise UsageError(f"{' and '.join(given + (['--resume'] if args.resume else []))}: give one of --config, "
                         f"--rerun and --resume (--config may amend a --resume)")
    if args.rerun:
        folder = Path(args.rerun)
        exp = experiment.stored(folder, p)
        if exp is None:
            raise UsageError(f"--rerun {folder}: no {experiment.FILE_NAME} there; give a session folder written by "
                             f"a sweep (results/<timestamp>)")
        return exp
    base = None
    if args.resume:
        base = experiment.stored(session_dir(args.out, args.session, True), p)
    if args.config:
        exp = experiment.read(args.config, p)
        if base is not None:
            exp.defaults = {**base.defaults, **exp.defaults}
            exp.networks = {**base.networks, **exp.networks}
            exp.hosts = exp.hosts or base.hosts
            exp.resolved = base.resolved
        return exp
    return base


def main(argv: Sequence[str] | None = None, prog: str = "automated_split_tester.py") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    exp = _experiment_of(p, args)
    if exp is not None:
        p.set_defaults(**exp.defaults)
        args = p.parse_args(argv)
    opts = options_from_args(args, exp)
    sweeper = Sweeper(opts)
    table = resolved_table(opts)
    if opts.resume and exp is not None and exp.resolved is not None:
        changed = experiment.differences(exp.resolved, table)
        if changed and not args.force_resume:
            raise UsageError(f"--resume {sweeper.dir}: the options differ from the session's experiment: "
                             f"{'; '.join(changed)}; run without the changed flags, or add --force-resume")
        if changed:
            log.warning("resuming with changed options (--force-resume): %s", "; ".join(changed))
    if opts.dry_run:
        from ..partition.structure import structure

        blocks = {m: structure(m, opts.num_classes)["num_blocks"] for m in opts.models}
        print(describe_plan(sweeper.plan(blocks), opts))
        return 0
    if args.check and opts.testbed.remote:
        from ..runners.doctor import check_testbed, format_checks

        rows, problems = check_testbed(opts.testbed, opts.models, opts.num_classes)
        print(format_checks(rows))
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 1
    tb = opts.testbed
    where = ("locally" if not tb.remote else " -> ".join(f"{h.address} ({h.device})" for h in tb.hosts) + " over SSH")
    _check_splits(sweeper, opts)
    log.info("sweep %s, link %s, results in %s", where, opts.link, sweeper.dir)
    created = not sweeper.dir.exists()
    sweeper.dir.mkdir(parents=True, exist_ok=True)
    experiment.write(sweeper.dir / experiment.FILE_NAME, table,
                     {n: c.to_values() for n, c in sweeper.networks.items()},
                     opts.testbed.to_table() if opts.testbed.remote else None)
    try:
        result = sweeper.run()
    except UsageError:
        # Found only once the workers built the model (a model file's blocks): nothing was
        # measured, so the folder goes rather than linger as an empty session.
        if created:
            sweeper.discard_if_unmeasured()
        raise
    out = result.path
    if not result.measured:
        print(f"error: nothing was measured: every run of {result.configurations} "
              f"configuration{'' if result.configurations == 1 else 's'} failed twice; "
              f"the attempts and their errors are in {out / 'failures.csv'}", file=sys.stderr)
        return 1
    if opts.cleanup:
        for path in (out / "runs").glob("*.json"):
            path.unlink()
    if opts.report and (out / "report" / "pareto.csv").is_file():
        import pandas as pd

        from ..analysis.sanity import format_sanity

        print("Pareto-optimal splits and those tied with them within 95% CIs (latency_s: median per batch; "
              "throughput in images/s):")
        print_front_table(out / "report", opts.objectives)
        if (out / "report" / "sanity.csv").is_file():
            print(format_sanity(pd.read_csv(out / "report" / "sanity.csv")))
        print_privacy_cost(out / "report")
        if (out / "report" / "adaptive_verdicts.csv").is_file():
            from ..analysis.adaptive import format_verdicts

            print(format_verdicts(pd.read_csv(out / "report" / "adaptive_verdicts.csv")))
    print(f"sweep done: {out} (runs.csv, summary.csv, failures.csv, session.json"
          + (", report/" if opts.report else "") + ")")
    if result.failed:
        keys = sorted({p.config_key for p in result.failed})
        print(f"error: {len(result.failed)} run(s) of {len(keys)} of {result.configurations} configurations failed "
              f"twice ({', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}); see {out / 'failures.csv'}",
              file=sys.stderr)
        return 1
    return 0


def _check_splits(sweeper: Sweeper, opts: Any) -> None:
    """A split beyond a zoo model's or a registered model's blocks is a usage error before any
    folder or worker exists (a zoo model's block count is cached: milliseconds). A model file's is
    traced anew on every call (about 3 s here), so it is left to the workers, which build the
    model anyway; the folder of a sweep they refuse is discarded."""
    from ..partition.names import is_model_file
    from ..partition.structure import structure

    for model in opts.models:
        if not is_model_file(model):
            sweeper.splits_for(structure(model, opts.num_classes)["num_blocks"])
