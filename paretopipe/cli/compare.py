"""``paretopipe compare A B``: two sessions' fronts side by side."""

from __future__ import annotations

from typing import Sequence

from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging


def parser(prog: str = "paretopipe compare") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Set two sweep sessions' Pareto fronts side by side: every configuration both "
                                   "measured with its change in latency and throughput, and per front which "
                                   "splits joined or left it (with the Jaccard index of the two front sets).",
                       epilog=example_epilog("paretopipe compare results/20261121-070107 results/20261122-091500",
                                             "paretopipe compare results-pi results-gpu --out comparison"))
    p.add_argument("a", help="session A: a session folder, or a results folder (its newest session)")
    p.add_argument("b", help="session B")
    p.add_argument("--out", default=None, help="also write compare_points.csv, compare_fronts.csv and figures here")
    p.add_argument("--format", default="png", choices=["png", "svg", "pdf"])
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe compare") -> int:
    from ..analysis.compare import compare, format_comparison

    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    result = compare(args.a, args.b, args.out, args.format)
    print(format_comparison(result))
    if result["files"]:
        print(f"written to {args.out}: {', '.join(p.name for p in result['files'])}")
    return 0
