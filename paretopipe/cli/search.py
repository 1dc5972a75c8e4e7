"""``paretopipe search``: the sweep's options over a space, within a budget of configurations."""

from __future__ import annotations

from typing import Sequence

from ..errors import UsageError
from ..llm.families import model_structure
from ..options import flags
from ..search.run import SearchOptions, SearchRun, describe, predicted_first, predicted_first_generation
from ..search.sweep_space import engine_list, parse_vary, search_space, with_first_choices, with_placements_of
from ..search.samplers import DEFAULT_SAMPLER, SAMPLERS
from .common import ArgumentParser, HelpFormatter, example_epilog, positive_float, positive_int, setup_logging
from .sweep_options import options_from_args
from .sweep_flags import add_flags


def parser(prog: str = "paretopipe search") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Search a space too large to sweep: the sweep's options, where --splits (or with --stages N a "
                    "plan's N - 1 cuts), --network, --backend, --encrypt and --transport span the space; each of "
                    "--budget configurations is measured by the sweep into one session (report, compare and watch "
                    "read it as a sweep's), the predicted front first with --device-profiles, then the sampler's. "
                    "search.json in the session lists every trial.",
        epilog=example_epilog(
            "paretopipe search --model resnet50 --stages 3 --budget 40 --network lan,lte",
            "paretopipe search --model mobilenetv2 --budget 8 --device-profiles edge.json,server.json --network lte"))
    search = p.add_argument_group("search")
    search.add_argument("--budget", "--search", type=_budget, required=True, dest="budget",
                        help="how many configurations to measure (the predicted front's count among them), or all: "
                             "the whole space; --search is automated_split_tester.py's name for it")
    search.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                        help="tpe (multi-objective TPE), gp (Gaussian-process EHVI), nsga2, qmc (Sobol) or random; "
                             "benchmarks/search.py chose the default")
    flags.STAGES.add_to(search, default=None, help="stages of each plan (3: two cuts; default 2); with --placements, "
                        "the placements of this many hosts (default: every placement, each with a plan of its own "
                        "number of stages)")
    flags.DEVICE_PROFILES.add_to(search, help="one device profile per stage (paretopipe profile), comma-separated: the cost model's "
                             "front per network is measured first")
    search.add_argument("--vary", action="append", default=[], metavar="NAME=A,B",
                        help="a setting the space varies, beside the split and the sweep lists: codec=WIRE/COMPRESSION,..."
                             " (e.g. codec=float32/none,float16/zstd,bfloat16/lz4), batch_size=1,4,8, in_flight=1,2,4 or"
                             " engine=torch,onnxruntime (as --engine's list); repeat for several")
    flags.STUDY.add_to(search, help="share the study with other workers, each on its own testbed (its own --env-file): "
                             "journal:PATH for workers on one machine, postgresql://USER@HOST[:PORT]/DB for several; "
                             "the budget holds for the whole study and nothing is measured twice")
    search.add_argument("--study-name", default=None, help="the shared study's name (default: paretopipe-MODEL)")
    search.add_argument("--study-grace-s", type=positive_float, default=None, metavar="S",
                        help="PostgreSQL study: a worker silent this long is taken for dead and its configuration "
                             "queued again (it beats every S/3; default 30)")
    search.add_argument("--testbed", default=None,
                        help="this worker's testbed as the study records it (default: its hosts' addresses, or local)")
    add_flags(p)
    return p


def _budget(text: str) -> int | None:
    """A budget: a whole number of at least 1, or ``all`` (None: the whole space)."""
    return None if text == "all" else positive_int(text)


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe search") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    vary = parse_vary(args.vary)
    opts = engine_list(options_from_args(args), vary)
    if opts.wire_dtypes:
        raise UsageError(f"{prog}: --wire-dtype {','.join(opts.wire_dtypes)}: a search varies the wire dtype as a "
                         f"dimension: --vary codec={','.join(d + '/' + opts.compression for d in opts.wire_dtypes)}")
    opts, args.stages = with_placements_of(with_first_choices(opts, vary), args.stages)
    num_blocks = model_structure(opts.models[0], opts.num_classes, opts.model_dir)["num_blocks"]
    space = search_space(opts, num_blocks, args.stages, vary)
    if args.budget is None:
        args.budget = space.size()
    profiles = [s.strip() for s in (args.device_profiles or "").split(",") if s.strip()]
    if profiles and space.length_dim:
        raise UsageError(f"{prog}: --device-profiles prices one number of devices; a search over placements of "
                         f"several (--placements {','.join(opts.placements)}) measures without it, or give --stages "
                         f"(predict --subsets prices every placement)")
    predicted = () if not profiles else \
        predicted_first_generation(profiles, opts, space, args.budget) if opts.workload.generates else \
        predicted_first(profiles, opts, space, args.stages, args.budget)
    if opts.dry_run:
        print(f"search space: {space.size()} configurations ("
              + ", ".join(f"{d.name}: {len(d.choices)}" for d in space.dims)
              + f"); budget {args.budget}; {len(predicted)} predicted first")
        return 0
    run = SearchRun(opts, SearchOptions(args.budget, args.sampler, args.stages, predicted=predicted, vary=vary,
                                        study_url=args.study, study_name=args.study_name, testbed=args.testbed,
                                        study_grace_s=args.study_grace_s),
                    num_blocks)
    result = run.run()
    if opts.report and (run.dir / "summary.csv").is_file():
        # lazy for start-up: pandas and matplotlib, for the report
        from ..analysis import report

        report.write_report(run.dir, run.dir / "report", objectives=opts.objectives)
    for line in describe(result, run):
        print(line)
    # In a shared study, a worker may find every configuration measured by the others: that is done, not failed.
    if not any(t.values is not None for t in result.trials) and not result.study_measured:
        print(f"error: no configuration was measured; see {run.dir / 'failures.csv'}")
        return 1
    return 0
