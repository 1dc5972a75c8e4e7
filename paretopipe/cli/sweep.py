"""``automated_split_tester.py`` and ``paretopipe sweep``: every split under every named network condition."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from ..options import flags
from ..controller.sweep import SweepOptions, Sweeper, describe_plan
from ..controller.sweep.plan import plan_runs, splits_for
from . import experiment
from .workload_flags import check_workload_flags
from .report import print_front_table, print_side_tables
from .common import ArgumentParser, HelpFormatter, example_epilog, setup_logging
from .sweep_flags import add_flags, resolved_table
from .sweep_options import experiment_of, options_from_args
from ..partition.names import is_model_file
from ..llm.families import model_structure
from ..controller.doctor import check_testbed, format_checks

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
    flags.STUDY.add_to(p, help="share the sweep's configurations with other workers, each on its own testbed, through a "
                        "search study (journal:PATH or postgresql://USER@HOST/DB): paretopipe search --budget all "
                        "--sampler random; each configuration is measured once, by one worker, with its runs")
    add_flags(p)
    return p


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
    exp = experiment_of(p, args)
    if exp is not None:
        p.set_defaults(**exp.defaults)
        args = p.parse_args(argv)
    opts = options_from_args(args, exp)
    check_workload_flags(p, args, opts.workload)
    sweeper = Sweeper(opts)
    table = resolved_table(opts)
    _check_resume(sweeper, exp, table, args.force_resume)
    if opts.dry_run:
        shapes = {m: model_structure(m, opts.num_classes, opts.model_dir) for m in opts.models}
        print(describe_plan(plan_runs(opts, {m: s["num_blocks"] for m, s in shapes.items()},
                                      {m: s["fine_cuts"] for m, s in shapes.items()}), opts))
        return 0
    if args.check and opts.testbed.remote and not _testbed_ready(opts):
        return 1
    _check_splits(opts)
    return _run(sweeper, opts, table, args.live)


def _check_resume(sweeper: Sweeper, exp: experiment.Experiment | None, table: dict, force: bool) -> None:
    """``--resume`` with options that differ from the session's stored experiment: refused in one
    line naming them, unless ``--force-resume``."""
    if not (sweeper.opts.resume and exp is not None and exp.resolved is not None):
        return
    changed = experiment.differences(exp.resolved, table)
    if changed and not force:
        raise UsageError(f"--resume {sweeper.dir}: the options differ from the session's experiment: "
                         f"{'; '.join(changed)}; run without the changed flags, or add --force-resume")
    if changed:
        log.warning("resuming with changed options (--force-resume): %s", "; ".join(changed))


def _testbed_ready(opts: SweepOptions) -> bool:
    """``--check``: paretopipe doctor's table of every host, and each problem on a line of its own."""
    rows, problems = check_testbed(opts.testbed, opts.models, opts.num_classes, model_dir=opts.model_dir)
    print(format_checks(rows))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return not problems


def _run(sweeper: Sweeper, opts: SweepOptions, table: dict, live_port: int | None) -> int:
    """The sweep itself, its session's experiment written first; a session nothing was measured
    in is discarded when the workers refuse the model."""
    tb = opts.testbed
    where = ("locally" if not tb.remote else " -> ".join(f"{h.address} ({h.device})" for h in tb.hosts) + " over SSH")
    live = _live_page(sweeper.dir, live_port)  # a port in use is refused before anything is written
    log.info("sweep %s, link %s, results in %s", where, opts.link, sweeper.dir)
    created = not sweeper.dir.exists()
    sweeper.dir.mkdir(parents=True, exist_ok=True)
    experiment.write(sweeper.dir / experiment.FILE_NAME, table,
                     {n: c.to_values() for n, c in sweeper.networks.items()},
                     tb.to_table() if tb.remote else None)
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

    print(f"Pareto-optimal splits and those tied with them within 95% CIs ({opts.workload.front_units}):")
    print_front_table(report, opts.objectives)
    if (report / "sanity.csv").is_file():
        print(format_sanity(pd.read_csv(report / "sanity.csv")))
    print_side_tables(report)
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
