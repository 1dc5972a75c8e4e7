"""The ``paretopipe`` command: one entry point, a subcommand per job (``paretopipe sweep --help``)."""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from .. import __version__
from .common import run_cli

# subcommand -> (module, function, one line of help). Each subcommand keeps its own parser.
COMMANDS = {
    "sweep": ("sweep", "main", "run every split under every network condition (automated_split_tester.py)"),
    "split": ("split", "main", "list the split points of a model"),
    "profile": ("profile", "main", "measure a device profile of a model on this device"),
    "predict": ("predict", "main", "predict every split from device profiles; plan N devices; validate"),
    "search": ("search", "main", "measure a budget of a space too large to sweep, the sampler choosing"),
    "report": ("report", "main", "Pareto fronts, tables and figures of a sweep session"),
    "watch": ("watch", "main", "a live page of a session while it runs (and /api/session as JSON)"),
    "compare": ("compare", "main", "two sessions' fronts side by side: deltas and which splits moved"),
    "netem": ("netem", "main", "apply, clear, show and measure network conditions (network_delay.py)"),
    "stage1": ("stages", "main_stage1", "stage 1 of a TCP pipeline, the data source (partition1.py)"),
    "stage2": ("stages", "main_stage2", "stage 2 of a TCP pipeline (partition2.py)"),
    "rpc": ("rpc", "main", "an N-stage pipeline over PyTorch RPC (distributed_runner.py)"),
    "lab": ("lab", "main", "a lab of namespace hosts with their own sshd, on this machine (root)"),
    "doctor": ("doctor", "main", "check (and --deploy to) every host of a testbed before a sweep"),
    "broker": ("broker", "main", "a Mosquitto broker with a user per stage, for stages run by hand over MQTT"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: paretopipe COMMAND [--help] ...   (paretopipe {__version__})", "",
             "Pareto-front benchmarking of split DNN inference. Commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "examples:", "  paretopipe split --model resnet18 --list",
              "  paretopipe sweep --model mobilenetv2 --splits all --network lan,wifi,lte",
              "  paretopipe predict --model mobilenetv2 --device-profiles edge.json,server.json --network lte"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"paretopipe {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; valid: {', '.join(COMMANDS)} (see paretopipe --help)",
              file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[name]
    handler = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    return handler(args[1:], prog=f"paretopipe {name}")


def entry() -> None:
    """Console-script entry point."""
    raise SystemExit(run_cli(main))
