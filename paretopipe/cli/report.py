"""``paretopipe report`` (and ``python -m paretopipe.report``): fronts, tables and figures of a session."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ..options import flags
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging

def add_objectives_flag(p: argparse.ArgumentParser) -> None:
    flags.OBJECTIVES.add_to(p, type=_objective_names, help=flags.OBJECTIVES.help + "; default latency,throughput "
                            "(a language model: ttft,tpot)")


def _objective_names(text: str) -> str:
    # lazy for start-up: pandas
    from ..analysis.objectives import check_names

    return check_names(text)


def print_front_table(report_dir: Path, objectives: str | None) -> None:
    """The front and tied points, with the objectives' columns beyond latency and throughput."""
    import pandas as pd

    # lazy for start-up: pandas
    from ..analysis.objectives import parse
    # lazy for start-up: pandas
    from ..analysis.report import format_front_table

    table = pd.read_csv(report_dir / "pareto.csv")
    print(format_front_table(table, [o.column for o in parse(objectives, table)]))


def parser(prog: str = "python -m paretopipe.report") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Pareto fronts, tables and figures of a sweep session.",
                       epilog=example_epilog("python -m paretopipe.report results",
                                             "python -m paretopipe.report results/20261121-070107 --format svg",
                                             "paretopipe report results --objectives latency,throughput,energy,memory"))
    p.add_argument("results", nargs="+",
                   help="a session folder, or a results folder (newest session); several: the sessions of one "
                        "shared search study, one per testbed, merged (testbeds.csv, testbed_disagreements.csv)")
    flags.OUT.add_to(p, help="output folder (default SESSION/report; several sessions: the "
                                               "first's report-testbeds)")
    flags.FORMAT.add_to(p)
    p.add_argument("--predictions", default=None, metavar="CSV",
                   help="predictions.csv of `paretopipe predict --latency-bound-ms B --out DIR`: each split's "
                        "predicted Server rate, printed beside the one LoadGen measured (loadgen_front.csv too)")
    add_objectives_flag(p)
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.report") -> int:
    import pandas as pd

    # lazy for start-up: pandas
    from ..analysis.report import write_report

    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if len(args.results) > 1:
        return _testbeds(args)
    args.results = args.results[0]
    # lazy for start-up: pandas
    from ..analysis.sanity import format_sanity

    # lazy for start-up: pandas
    from ..analysis.loadgen_front import read_predictions

    predicted = read_predictions(Path(args.predictions)) if args.predictions else None  # refused before any work
    out = write_report(args.results, args.out, args.format, objectives=args.objectives, predictions=predicted)
    print_front_table(out, args.objectives)
    print(format_sanity(pd.read_csv(out / "sanity.csv")))
    print_side_tables(out)
    if (out / "adaptive_verdicts.csv").is_file():
        # lazy for start-up: pandas
        from ..analysis.adaptive_comparison import format_verdicts

        print(format_verdicts(pd.read_csv(out / "adaptive_verdicts.csv")))
    print(f"report written to {out}")
    return 0


def _testbeds(args: argparse.Namespace) -> int:
    # lazy for start-up: pandas
    from ..analysis import testbeds
    # lazy for start-up: pandas
    from ..analysis.session import find_session

    out = Path(args.out) if args.out else find_session(Path(args.results[0])).path / "report-testbeds"
    table, flags = testbeds.write([Path(r) for r in args.results], out, args.objectives)
    names = [n.strip() for n in (args.objectives or "latency,throughput").split(",")]
    for line in testbeds.describe(table, flags, names):
        print(line)
    print(f"report written to {out}")
    return 0


def print_side_tables(report_dir: Path) -> None:
    """The sealed-over-plain table, when the session swept ciphers, the transports-over-TCP table,
    when it swept transports, the LoadGen fronts, when it swept scenarios, and what each extra
    device buys, when it ran on several numbers of devices (the sweep prints them too)."""
    import pandas as pd

    # lazy for start-up: pandas
    from ..analysis.privacy import format_privacy_cost
    # lazy for start-up: pandas
    from ..analysis.report import PRIVACY_FILE, TRANSPORT_FILE
    # lazy for start-up: pandas
    from ..analysis.transport_cost import format_transport_cost

    # lazy for start-up: pandas
    from ..analysis import devices, loadgen_front

    if (report_dir / PRIVACY_FILE).is_file():
        print(format_privacy_cost(pd.read_csv(report_dir / PRIVACY_FILE)))
    if (report_dir / loadgen_front.FILE).is_file():
        marked = pd.read_csv(report_dir / loadgen_front.FILE)
        marked.attrs["objectives"] = loadgen_front.front_objectives(marked)
        for line in loadgen_front.describe(marked):
            print(line)
    if (report_dir / TRANSPORT_FILE).is_file():
        print(format_transport_cost(pd.read_csv(report_dir / TRANSPORT_FILE)))
    if (report_dir / devices.FILE).is_file():
        for line in devices.describe(pd.read_csv(report_dir / devices.FILE)):
            print(line)
