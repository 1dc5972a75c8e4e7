"""``paretopipe compare A B``: two sessions' fronts side by side."""

from __future__ import annotations

from typing import Sequence

from ..errors import UsageError
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, positive_float, setup_logging
from ..options import flags
from .report import add_objectives_flag


def parser(prog: str = "paretopipe compare") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Set two sweep sessions' Pareto fronts side by side: every configuration both "
                                   "measured with its change in latency and throughput, and per front which "
                                   "splits joined or left it (with the Jaccard index of the two front sets).",
                       epilog=example_epilog("paretopipe compare results/20261121-070107 results/20261122-091500",
                                             "paretopipe compare results-pi results-gpu --out comparison",
                                             "paretopipe compare results --goal 0.9 --selective wifi:4,lte:4   # the "
                                             "newest two sessions"))
    p.add_argument("a", help="session A: a session folder, or a results folder (its newest session); alone, a "
                             "results folder whose two newest sessions are compared")
    p.add_argument("b", nargs="?", default=None, help="session B")
    p.add_argument("--goal", type=positive_float, default=None,
                   help="reproducibility goal: the epsilon-fronts of every network agree at least this well "
                        "(Jaccard, e.g. 0.9); ends with a line saying whether every goal is met")
    p.add_argument("--selective", default=None,
                   help="with --goal: networks whose epsilon-fronts must leave out the early splits, as "
                        "NETWORK:KMAX pairs, e.g. wifi:4,lte:4")
    flags.OUT.add_to(p, help="also write compare_points.csv, compare_fronts.csv and figures here")
    flags.FORMAT.add_to(p)
    add_objectives_flag(p)
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe compare") -> int:
    # lazy for start-up: pandas
    from ..analysis.compare import compare, format_comparison, goals, newest_two

    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    selective = _selective(args.selective)
    a, b = (args.a, args.b) if args.b else newest_two(args.a)
    result = compare(a, b, args.out, args.format, objectives=args.objectives)
    print(format_comparison(result))
    if result["files"]:
        print(f"written to {args.out}: {', '.join(p.name for p in result['files'])}")
    if args.goal is not None:
        lines, met = goals(result, args.goal, selective)
        for line in lines:
            print(f"  {line}")
        print(f"reproducibility goals {'met' if met else 'NOT met'} ({result['a'].name} vs {result['b'].name})")
    return 0


def _selective(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        network, _, kmax = part.partition(":")
        if not network.strip() or not kmax.strip().isdigit():
            raise UsageError(f"--selective {text!r}: give NETWORK:KMAX pairs, e.g. wifi:4,lte:4")
        out[network.strip()] = int(kmax)
    return out
