"""``paretopipe split`` (and ``python -m paretopipe.split``): list the split points of a model."""

from __future__ import annotations

from typing import Sequence

from ..options import flags
from ..errors import UsageError
from ..llm import shapes
from ..llm.checkpoints import REAL
from ..partition.names import ANCHOR_ALIASES, DETECTORS, REAL_IMAGE_MODELS
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging
from ..partition.structure import structure


def parser(prog: str = "python -m paretopipe.split") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="List the split points of a model (block-level, or every fx cut with --fine).",
        epilog=example_epilog("python -m paretopipe.split --model resnet50 --list",
                              "python -m paretopipe.split --model mobilenetv2 --list --fine",
                              "python -m paretopipe.split --model resnet18,yolox_n --plot cuts.png --max-live 3"))
    flags.MODEL.add_to(p, help=flags.MODEL.help + " (several, comma-separated, with --plot), or a language model "
                               f"({', '.join(shapes.NAMED)})")
    flags.MODEL_DIR.add_to(p)
    flags.WIRE_DTYPE.add_to(p, help="a language model's hidden state on the wire, for the bytes per token")
    p.add_argument("--list", action="store_true", help="print the split table (the default action)")
    p.add_argument("--list-models", action="store_true",
                   help="the named models, which have trained weights and where those come from")
    flags.FINE.add_to(p, help="every fx cut instead of block cuts, with the tensors that cross it (a + joins several)")
    flags.MAX_LIVE.add_to(p, default=None, help="with --fine or --plot: only cuts that at most this many tensors cross (default: all; "
                        "--plot: 3)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="draw bytes across each cut against stage 1's share of the FLOPs, a panel per model")
    flags.NUM_CLASSES.add_to(p)
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.split") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.list_models:
        print(model_catalogue())
        return 0
    if shapes.workload_of(args.model, args.model_dir).generates:
        # lazy for start-up: transformers (reading a folder's config checks its architecture)
        from ..llm.build import source

        print(shapes.cut_table(source(None if args.model_dir else args.model, args.model_dir).shape, args.wire_dtype))
        return 0
    if args.model is None:
        raise UsageError("give --model NAME (or --model-dir DIR for a language model)")
    if args.plot:
        return _plot(args)
    if "," in args.model:
        raise UsageError(f"--model {args.model}: several models go with --plot; --list takes one")
    doc = structure(args.model, args.num_classes)
    if args.fine and args.max_live is not None:
        print(_narrowed(doc, args.max_live))
    else:
        print(doc["fine_table"] if args.fine else doc["block_table"])
    return 0


def model_catalogue() -> str:
    """Every named model, a line each: its kind and where its weights come from (the real ones'
    package, and whether it is installed here)."""
    import importlib.util

    def installed(modules: list[str]) -> str:
        return "installed" if all(importlib.util.find_spec(m) for m in modules) else "not installed: pip install -e '.[real]'"

    rows = [("model", "kind", "weights")]
    for name, real in REAL_IMAGE_MODELS.items():
        rows.append((name, "image, trained", f"{real['weights']}; {installed([m for _, m in real['packages']])}"))
    for name, lm in REAL.items():
        rows.append((name, "language, trained", f"{lm.about} ({lm.package}, {lm.licence}); {installed([lm.module])}"))
    portable = "deterministic (the same bits on every host, untrained)"
    rows += [(a, "image", f"{portable}; --weights DEFAULT: torchvision's trained ones") for a in ANCHOR_ALIASES]
    rows += [(d, "detector", portable) for d in DETECTORS]
    rows += [(n, "language", f"{portable}; its published shape ({s.source})") for n, s in shapes.NAMED.items()]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}" for r in rows]
    return "\n".join(lines + ["(every torchvision classifier too, deterministic or --weights NAME; a folder, "
                               "hub id or .gguf with --model-dir; your own as path/to/file.py:function)"])


def _narrowed(doc: dict, max_live: int) -> str:
    """The fine table's rows of cuts that at most ``max_live`` tensors cross: its rows are the
    structure's fine cuts, in the same order."""
    header, *rows = doc["fine_table"].splitlines()
    return "\n".join([header] + [r for r, (width, _) in zip(rows, doc["fine_cuts"].values()) if width <= max_live])


def _plot(args) -> int:
    # lazy for start-up: pandas
    from ..analysis.cutplot import plot_cuts
    # lazy for start-up: torch
    from ..partition.tables import cut_rows, partitioner_for

    rows = {}
    for name in [m.strip() for m in args.model.split(",")]:
        _, part = partitioner_for(name, batch=1, num_classes=args.num_classes, structure_only=True)
        rows[part.model_name or name] = cut_rows(part, args.max_live or 3)
    path = plot_cuts(rows, args.plot)
    for name, r in rows.items():
        better = sum(x["less_than_neighbours"] for x in r)
        print(f"{name}: {len(r)} cuts, {sum(x['width'] > 1 for x in r)} with several tensors, {better} of them "
              f"send less than the single-tensor cuts around them")
    print(f"written {path}")
    return 0
