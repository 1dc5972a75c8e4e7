"""``automated_split_tester.py`` and ``paretopipe sweep``: every split under every named network condition."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from .. import cpushare, cputrace
from ..errors import UsageError
from ..runners.hosts import Testbed
from ..runners.processes import check_stage_devices
from ..analysis.session import sweep_session_dir
from ..runners.sweep import SweepOptions, Sweeper, describe_plan
from ..runners.sweep.plan import plan_runs, splits_for
from ..splits import parse_plans
from ..network import traces
from ..transport import aead, messaging
from ..transport.auth import load_secret
from . import experiment
from .workload_flags import check_workload_flags
from .report import print_front_table, print_privacy_cost
from .common import (ArgumentParser, HelpFormatter, dataset_from_args, example_epilog, loadgen_sweep_settings,
                     prefetch_from_args, read_env, setup_logging)
from .sweep_flags import add_flags, resolved_table, simple_fields
from ..partition.names import canonical_name, is_model_file
from ..energy.memory import parse_limits
from ..llm.shapes import is_language_model, model_structure, shape_of
from ..runners.doctor import check_testbed, format_checks

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
            "paretopipe sweep --rerun results/20261122-091500   # the same experiment again, a new session",
            "python automated_split_tester.py --model resnet50 --search 40 --network lan,lte"))
    p.add_argument("--search", type=int, metavar="BUDGET", default=None,
                   help="search the space instead of sweeping it: measure BUDGET configurations, as paretopipe "
                        "search --budget BUDGET does (its --sampler, --stages, --device-profiles, --vary and --study "
                        "apply)")
    p.add_argument("--study", default=None, metavar="URL",
                   help="share the sweep's configurations with other workers, each on its own testbed, through a "
                        "search study (journal:PATH or postgresql://USER@HOST/DB): paretopipe search --budget all "
                        "--sampler random; each configuration is measured once, by one worker, with its runs")
    add_flags(p)
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


def _models(args: argparse.Namespace) -> list[str]:
    """The sweep's models, each name checked here, before any host is asked to build it (a
    ``--model-dir`` folder's model is named by its config.json's folder)."""
    if args.model_dir is not None:
        return [shape_of(None, args.model_dir).name]
    models = [m.strip() for m in (args.models or args.model or "mobilenetv2").split(",") if m.strip()]
    if not models:
        raise UsageError("--models names no model")
    for model in models:
        if not is_language_model(model):
            canonical_name(model)
    return models


def options_from_args(args: argparse.Namespace, exp: experiment.Experiment | None = None) -> SweepOptions:
    models = _models(args)
    language_model = is_language_model(models[0], args.model_dir)
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
    # Flags that set a field as it is come from the table; these combine flags or check them.
    return SweepOptions(**simple_fields(args), models=models, plans=plans, networks=networks, backends=backends,
                        link=link, prefetch_batches=prefetch_from_args(args),
                        optimizations=not args.no_optimizations, report=not args.no_report, testbed=testbed,
                        ciphers=_ciphers(args.encrypt, backends, testbed),
                        transports=_transports(args.transport, backends),
                        stage_cpu=cpushare.parse_shares(args.stage_cpu, 2),
                        stage_cpu_trace=cputrace.parse_stage_traces(args.stage_cpu_trace),
                        stage_threads=_per_stage_ints(args.stage_threads, "--stage-threads"),
                        stage_devices=check_stage_devices(devices, stages) if not testbed.remote else [],
                        dataset="synthetic" if language_model else dataset_from_args(args, args.compression,
                                                                                     local=not testbed.remote),
                        data_dir=args.data_dir, inline_networks=inline, objectives=args.objectives,
                        power_idle_w=_per_stage_floats(args.power_idle_w, "--power-idle-w", stages),
                        power_core_w=_per_stage_floats(args.power_core_w, "--power-core-w", stages),
                        memory_limits=_memory_limits(args.memory_limit, stages),
                        deadline_s=args.deadline_ms / 1e3 if args.deadline_ms else None,
                        loadgen_settings=loadgen_sweep_settings(args, args.scenario))


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


def _transports(text: str, backends: list[str]) -> list[str]:
    """--transport's list, refused where it cannot apply: with the rpc backend alone (its
    TensorPipe channel is its own transport)."""
    choices = [messaging.check_transport(t) for t in dict.fromkeys(t.strip() for t in text.split(",") if t.strip())]
    if not choices:
        raise UsageError(f"--transport {text!r} names no transport; valid: {', '.join(messaging.TRANSPORTS)}")
    carried = [t for t in choices if t != "tcp"]
    if carried and "tcp" not in backends:
        raise UsageError(f"--transport {carried[0]} carries the TCP backend's frames; the rpc backend has its own "
                         f"channel: use --backend tcp (or both, where the rpc runs stay as they are)")
    return choices


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
        base = experiment.stored(sweep_session_dir(args.out, args.session, True), p)
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
    given = list(argv if argv is not None else sys.argv[1:])
    searching = any(arg == "--search" or arg.startswith("--search=") for arg in given)
    if searching or any(arg == "--study" or arg.startswith("--study=") for arg in given):
        # lazy for start-up: the search's modules (optuna) only when searching
        from . import search

        # A sweep shared through a study is a search of its whole space: each worker takes the
        # next configuration no worker has measured (in random order, as a sweep's rounds).
        return search.main(given if searching else given + ["--budget", "all", "--sampler", "random"], prog)
    p = parser(prog)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    exp = _experiment_of(p, args)
    if exp is not None:
        p.set_defaults(**exp.defaults)
        args = p.parse_args(argv)
    opts = options_from_args(args, exp)
    check_workload_flags(p, args, opts.language_model)
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
        shapes = {m: model_structure(m, opts.num_classes, opts.model_dir) for m in opts.models}
        print(describe_plan(plan_runs(opts, {m: s["num_blocks"] for m, s in shapes.items()},
                                      {m: s["fine_cuts"] for m, s in shapes.items()}), opts))
        return 0
    if args.check and opts.testbed.remote:
        rows, problems = check_testbed(opts.testbed, opts.models, opts.num_classes, model_dir=opts.model_dir)
        print(format_checks(rows))
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 1
    tb = opts.testbed
    where = ("locally" if not tb.remote else " -> ".join(f"{h.address} ({h.device})" for h in tb.hosts) + " over SSH")
    _check_splits(opts)
    live = _live_page(sweeper.dir, args.live)  # a port in use is refused before anything is written
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
    finally:
        if live is not None:
            live.close()
    return _finish(result, opts)


def _live_page(session: Path, port: int | None):
    """``--live``: the session's page served from this process while the sweep runs (a thread that
    only reads the session; it never stops the sweep)."""
    if port is None:
        return None
    # lazy for start-up: pandas
    from ..analysis.live_server import WatchServer

    server = WatchServer(session, port=port)
    server.start_thread()
    print(f"live page: {server.url}", file=sys.stderr, flush=True)
    return server


def _finish(result: Any, opts: Any) -> int:
    """After the sweep: its closing tables and where they are, or what failed (exit status 1)."""
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
        _print_report(out / "report", opts)
    print(f"sweep done: {out} (runs.csv, summary.csv, failures.csv, session.json"
          + (", report/" if opts.report else "") + ")")
    if result.failed:
        keys = sorted({p.config_key for p in result.failed})
        print(f"error: {len(result.failed)} run(s) of {len(keys)} of {result.configurations} configurations failed "
              f"twice ({', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}); see {out / 'failures.csv'}",
              file=sys.stderr)
        return 1
    return 0


def _print_report(report: Path, opts: SweepOptions) -> None:
    """The closing tables: the front and its ties, the sanity checks, what sealing costs, and the
    adaptive split's verdicts, each where the report wrote it."""
    import pandas as pd

    # lazy for start-up: pandas
    from ..analysis.sanity import format_sanity

    print("Pareto-optimal splits and those tied with them within 95% CIs (" + (
        "time to first token and per token: medians, s; throughput in tokens/s):" if opts.language_model else
        "latency_s: median per batch; throughput in images/s):"))
    print_front_table(report, opts.objectives)
    if (report / "sanity.csv").is_file():
        print(format_sanity(pd.read_csv(report / "sanity.csv")))
    print_privacy_cost(report)
    if (report / "adaptive_verdicts.csv").is_file():
        # lazy for start-up: pandas
        from ..analysis.adaptive_comparison import format_verdicts

        print(format_verdicts(pd.read_csv(report / "adaptive_verdicts.csv")))


def _check_splits(opts: SweepOptions) -> None:
    """A split beyond a zoo model's or a registered model's blocks is a usage error before any
    folder or worker exists (a zoo model's block count is cached: milliseconds). A model file's is
    traced anew on every call (about 3 s here), so it is left to the workers, which build the
    model anyway; the folder of a sweep they refuse is discarded."""
    for model in opts.models:
        if not is_model_file(model):
            shape = model_structure(model, opts.num_classes, opts.model_dir)
            splits_for(opts, shape["num_blocks"], shape["fine_cuts"])
