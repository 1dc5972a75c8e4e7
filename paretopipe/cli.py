"""Shared command-line plumbing: one-line errors, exit codes, logging, --debug."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from .errors import ParetoPipeError


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors")


LINK_FLAGS = (("delay", "50ms"), ("jitter", "5ms"), ("loss", "1%%"), ("rate", "10mbit"))  # %% : argparse formats help


def add_link_flags(group) -> None:
    """--profile, --profiles-file and the ad-hoc --delay/--jitter/--distribution/--loss/--rate."""
    group.add_argument("--profile", default=None, help="profile from netem/profiles.toml (lan, wifi, lte, 4g, 3g, ...)")
    group.add_argument("--profiles-file", default=None, help="profiles TOML (default netem/profiles.toml)")
    for key, example in LINK_FLAGS:
        group.add_argument(f"--{key}", default=None, help=f"ad-hoc {key} (e.g. {example}); overrides the profile")
    group.add_argument("--distribution", default=None, help="jitter distribution: normal, pareto, paretonormal, uniform")


def profile_from_args(args, required: bool = False):
    """The profile the link flags describe, or None when none was given (and none is required)."""
    from .link import get_profile

    adhoc = {key: getattr(args, key) for key, _ in LINK_FLAGS}
    adhoc["distribution"] = args.distribution
    if not required and not (args.profile or any(v for k, v in adhoc.items() if k != "distribution")):
        return None
    return get_profile(args.profile, args.profiles_file, **adhoc)


def setup_logging(debug: bool = False, quiet: bool = False) -> None:
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr, force=True)


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main`` and turn project errors into one line on stderr plus an exit code.

    Tracebacks appear only with ``--debug``, so users see what went wrong and what is valid,
    not where in our code it was noticed.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        return main(args) or 0
    except ParetoPipeError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head: not an error of ours
        sys.stderr.close()
        return 0


def example_epilog(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in --help and examples kept as written."""
