"""``paretopipe doctor``: check every host of a testbed before an hour-long sweep (and --deploy to it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from ..llm.shapes import shape_of
from ..options import flags
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, read_env, setup_logging
from ..controller.doctor import check_testbed, deploy, format_checks
from ..controller.hosts import Testbed


def parser(prog: str = "paretopipe doctor") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="For each host in .env: reachable over SSH with the key; the same code (commit and digest), "
                    "torch and weights fingerprints as this machine; tc and root or passwordless sudo; the data "
                    "port free; CUDA where a GPU device was asked for. Prints a table, then one line per problem.",
        epilog=example_epilog("paretopipe doctor --model mobilenetv2",
                              "paretopipe doctor --env-file lab.env --model resnet18 --deploy"))
    flags.ENV_FILE.add_to(p)
    flags.MODEL.add_to(p, aliases=("--models",), dest="models", default="mobilenetv2", help="comma list of models to fingerprint "
                   "(image models, or language models: tiny-lm, smollm2-135m, ...)")
    flags.MODEL_DIR.add_to(p, help="a language model's folder, at this path on every host (its name is the folder's)")
    flags.NUM_CLASSES.add_to(p)
    flags.STAGE_DEVICES.add_to(p, help="device per host, e.g. cpu,cuda (overrides .env)")
    p.add_argument("--deploy", action="store_true",
                   help="first ship this working tree to REMOTE_DIR on every host (and a venv where needed)")
    p.add_argument("--no-tc", action="store_true", help="do not require tc and root (for --link emulated)")
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "paretopipe doctor") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    devices = [d.strip() for d in args.stage_devices.split(",")] if args.stage_devices else None
    testbed = Testbed.from_env(read_env(args.env_file), devices)
    models = [shape_of(None, args.model_dir).name] if args.model_dir else \
        [m.strip() for m in args.models.split(",") if m.strip()]
    if args.deploy:
        root = Path(__import__("paretopipe").__file__).resolve().parent.parent
        for host in testbed.hosts:
            host.remote_python = deploy(host, root)
            print(f"deployed to {host.address}:{host.remote_dir} (python {host.remote_python})")
    rows, problems = check_testbed(testbed, models, args.num_classes, tc_needed=not args.no_tc, model_dir=args.model_dir)
    print(format_checks(rows))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0
