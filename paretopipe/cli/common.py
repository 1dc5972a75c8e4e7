"""Shared command-line plumbing: one-line errors, exit codes, logging, --debug, shared flags."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any, Callable, NoReturn, Sequence

from .. import __version__
from ..envfile import read_env  # noqa: F401  (re-exported for the command modules)
from ..argtypes import (nonneg_float, nonneg_int, percent, port_number, port_or_zero,  # noqa: F401
                        positive_float, positive_int)  # (re-exported for the command modules)
from ..errors import ParetoPipeError, UsageError
from ..transport import auth, inputs
from ..transport.messaging import MqttSettings, TransportSpec
from ..loadgen.settings import CLOSED_LOOP, LoadgenOptions, require_loadgen
from ..options import flags
from ..transport.runconfig import RunConfig
from ..network.conditions import get_conditions

# (flag, example) of the ad-hoc network values; "%%" because argparse formats help text.
NETWORK_VALUES = (("delay", "50ms"), ("jitter", "5ms"), ("loss", "1%%"), ("rate", "10mbit"))


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: <what>; <what is valid> (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in --help (once, by argparse; help texts never repeat them) and examples as written."""


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--version", action="version", version=f"paretopipe {__version__}")


def add_network_flags(group, many: bool = False) -> None:
    """--network (named conditions from profiles.toml), --network-file and ad-hoc values."""
    if many:
        flags.NETWORK.add_to(group, aliases=("--networks", "--profiles", "--profile"),
                             help="comma list of named network conditions from profiles.toml (lan, wifi, lte, 4g, "
                                  "3g, ...); --profiles is the anchor's name")
    else:
        flags.NETWORK.add_to(group, aliases=("--profile",), help=flags.NETWORK.help + " (lan, wifi, lte, 4g, 3g, ...)")
    flags.NETWORK_FILE.add_to(group, aliases=("--profiles-file",))
    for key, example in NETWORK_VALUES:
        group.add_argument(f"--{key}", default=None,
                           help=f"ad-hoc {key} (e.g. {example}, or UP/DOWN values); overrides the named conditions")
    group.add_argument("--distribution", default=None, help="jitter distribution: normal, pareto, paretonormal, uniform")
    flags.TRACE.add_to(group)


def add_dataset_flags(group, default: str = "synthetic") -> None:
    """--dataset (a spec: synthetic, photos, cifar10[:PATH], imagefolder:PATH) and the anchor's --data-dir."""
    group.add_argument("--dataset", default=default,
                       help="inputs: synthetic (the anchor's dummy), photos (real photographs scikit-image ships), "
                            "cifar10[:PATH], imagefolder:PATH" + ("; auto = photos when a codec is measured, "
                                                                  "synthetic otherwise" if default == "auto" else ""))
    group.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py (for --dataset cifar10)")


#: The anchor's depth when --enable-prefetch is given without --prefetch-batches.
ANCHOR_PREFETCH_BATCHES = 2


def add_prefetch_flags(group) -> None:
    """The anchor's --enable-prefetch and --prefetch-batches N (the second alone enables it too)."""
    group.add_argument("--enable-prefetch", action="store_true",
                       help=f"prepare input batches ahead in a thread (decoded, transformed, stacked; "
                            f"{ANCHOR_PREFETCH_BATCHES} ahead unless --prefetch-batches says otherwise)")
    group.add_argument("--prefetch-batches", type=int, default=None, metavar="N",
                       help="batches prepared ahead (implies --enable-prefetch; 0 turns prefetching off)")


def prefetch_from_args(args: argparse.Namespace) -> int:
    """Batches to prepare ahead: --prefetch-batches, else the anchor's 2 with --enable-prefetch, else 0."""
    n = args.prefetch_batches
    if n is None:
        return ANCHOR_PREFETCH_BATCHES if args.enable_prefetch else 0
    if n < 0:
        raise UsageError(f"--prefetch-batches {n}: give 0 (off) or more batches")
    return n


def dataset_from_args(args: argparse.Namespace, compression: str = "none", local: bool = True) -> str:
    """The resolved dataset spec; checked on this machine when this machine reads it."""
    spec = inputs.resolve_default(args.dataset, compression)
    if local:
        inputs.check_local(spec, args.data_dir)
    return spec


def add_loadgen_flags(parser: argparse.ArgumentParser) -> None:
    """The MLPerf LoadGen flags of a data source (partition1.py, distributed_runner.py's master)."""
    g = parser.add_argument_group("MLPerf LoadGen (--scenario): LoadGen drives the whole pipeline from the data source")
    flags.SCENARIO.add_to(g)
    g.add_argument(*flags.MLPERF_COMPLIANT.flags, action="store_true", help=flags.MLPERF_COMPLIANT.help)
    for row, _ in flags.LOADGEN_VALUES:
        row.add_to(g)


def loadgen_sweep_settings(args: argparse.Namespace, scenarios: Sequence[str]) -> dict[str, Any]:
    """A sweep's LoadGen settings, each of its scenarios checked with them now (before anything
    starts); without a LoadGen scenario every LoadGen flag is refused."""
    settings = flags.loadgen_settings(args)
    wanted = [s for s in scenarios if s != CLOSED_LOOP]
    if not wanted:
        _refuse_loadgen_flags(args, settings)
        return {}
    for scenario in wanted:
        LoadgenOptions.of_flags(scenario, **settings)
    require_loadgen()
    return settings


def _refuse_loadgen_flags(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    given = [row.flags[0] for row, _ in flags.LOADGEN_VALUES if getattr(args, row.name) != row.default]
    given += ["--mlperf-compliant"] if settings["compliant"] else []
    if given:
        raise UsageError(f"{given[0]} applies to a LoadGen run: give --scenario "
                         f"(singlestream, multistream, offline or server)")


def loadgen_from_args(args: argparse.Namespace) -> Any:
    """The run's LoadgenOptions (None without --scenario, where every LoadGen flag is refused)."""
    settings = flags.loadgen_settings(args)
    if args.scenario is None:
        _refuse_loadgen_flags(args, settings)
        return None
    if getattr(args, "save_outputs", None):
        raise UsageError("--save-outputs with --scenario: LoadGen's queries vary in size; drop one, or use "
                         "--loadgen-mode accuracy, which checks the outputs against labels")
    options = LoadgenOptions.of_flags(args.scenario, **settings)
    require_loadgen()
    return options


def run_config_from_flags(args: argparse.Namespace, model: str, cuts: list[str], split_index: Any,
                          conditions: Any, timeout_s: float, **fields: Any) -> Any:
    """The one place a stage command builds its run configuration from its flags: the workload
    (batch size, warm-up, inputs, prefetch), the model and the network conditions; ``fields`` are
    what the command sets itself (its batch count, window, backend options), and win."""
    common: dict[str, Any] = dict(
        model=model, cuts=cuts, split_index=split_index, batch_size=args.batch_size, warmup=args.warmup,
        data_dir=args.data_dir, prefetch_batches=prefetch_from_args(args), num_classes=args.num_classes,
        network=conditions.name if conditions else None, link_mode="emulated" if conditions else "none",
        timeout_s=timeout_s)
    return RunConfig(**{**common, **fields})


def save_outputs(path: str, outputs: list[Any]) -> None:
    """``--save-outputs``: a classifier's logits as ``logits``; a detector's boxes, scores, labels and
    counts per image (paretopipe.partition.detection) as arrays of those names, batch after batch."""
    import numpy as np
    import torch

    if outputs and isinstance(outputs[0], tuple):
        names = ("boxes", "scores", "labels", "counts")
        np.savez(path, **{n: torch.stack([o[i] for o in outputs]).numpy() for i, n in enumerate(names)})
    else:
        np.savez(path, logits=torch.stack(outputs).numpy())


def adhoc_network_values(args: argparse.Namespace) -> dict[str, Any]:
    out = {key: getattr(args, key, None) for key, _ in NETWORK_VALUES}
    out["distribution"] = getattr(args, "distribution", None)
    out["trace"] = getattr(args, "trace", None)
    return out


def network_from_args(args: argparse.Namespace, required: bool = False):
    """The network conditions the flags describe, or None when none was given (and none is required)."""
    adhoc = adhoc_network_values(args)
    given = {k: v for k, v in adhoc.items() if v and k != "distribution"}
    if not required and not (args.network or given):
        return None
    if args.network and "," in args.network:
        raise UsageError(f"--network {args.network!r}: this command takes one named condition, not a list")
    return get_conditions(args.network, args.network_file, **adhoc)


#: The project's own loggers (``paretopipe.*``): the only ones whose INFO lines a user sees.
PROJECT_LOGGER = "paretopipe"


class _ProjectOrWarning(logging.Filter):
    """Let a library's line through only at WARNING or above: matplotlib says "generated new
    fontManager" at INFO the first time it runs on a machine, which broke the one-line errors of
    every new user's first command."""

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == PROJECT_LOGGER or record.name.startswith(PROJECT_LOGGER + ".")
        return own or record.levelno >= logging.WARNING


def setup_logging(debug: bool = False, quiet: bool = False) -> None:
    """The project's loggers at INFO (WARNING with --quiet); every other library's at WARNING,
    unless --debug, which shows everything."""
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr, force=True)
    logging.getLogger(PROJECT_LOGGER).setLevel(level)
    if not debug:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_ProjectOrWarning())


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
    except Exception as exc:  # a defect of ours: still one line, and --debug shows where
        if debug:
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"error: unexpected {type(exc).__name__}: {first} (a defect: rerun with --debug for the traceback "
              f"and report it)", file=sys.stderr)
        return 1


def example_epilog(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def stage_secret(args: argparse.Namespace) -> bytes | None:
    """The data port's shared secret from ``--env-file`` (None when it names none)."""
    return auth.load_secret(read_env(args.env_file).get(auth.SECRET_ENV))


def transport_spec(args: argparse.Namespace) -> TransportSpec:
    """The data port's ``--transport`` (for MQTT, the broker and this stage's user from ``--env-file``)."""
    if args.transport != "mqtt":
        return TransportSpec(args.transport)
    return TransportSpec("mqtt", MqttSettings.from_env(read_env(args.env_file), int(args.mqtt_qos)))


def signals_as_interrupt() -> None:
    """The sweeper stops stages with SIGTERM and an SSH disconnect sends SIGHUP; both act like
    Ctrl-C, so the JSON is still written and sockets are closed."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def fmt_ms(x: float | None) -> str:
    """Seconds as milliseconds for a one-line report (n/a when not measured)."""
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


def fmt_num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"
