"""``paretopipe split`` (and ``python -m paretopipe.split``): list the split points of a model."""

from __future__ import annotations

from typing import Sequence

from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging


def parser(prog: str = "python -m paretopipe.split") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="List the split points of a model (block-level, or every fx cut with --fine).",
        epilog=example_epilog("python -m paretopipe.split --model resnet50 --list",
                              "python -m paretopipe.split --model mobilenetv2 --list --fine"))
    p.add_argument("--model", required=True, help="zoo name, e.g. mobilenetv2, resnet50, vit_b_16")
    p.add_argument("--list", action="store_true", help="print the split table (the default action)")
    p.add_argument("--fine", action="store_true", help="every fx cut instead of block cuts")
    p.add_argument("--num-classes", type=int, default=10)
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.split") -> int:
    from ..partition.structure import structure

    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    doc = structure(args.model, args.num_classes)
    print(doc["fine_table"] if args.fine else doc["block_table"])
    return 0
