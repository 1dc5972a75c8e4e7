"""``paretopipe profile`` (and ``python -m paretopipe.profile``): measure a device profile."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Sequence

from ..options import flags
from ..errors import UsageError
from ..workload import GENERATION, IMAGES
from ..llm.shapes import workload_of
from .workload_flags import LANGUAGE_MODELS, check_workload_flags
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_dataset_flags, dataset_from_args,
                     example_epilog, positive_int, setup_logging)
from ..predict.device_profile import DEFAULT_CODECS
from .. import engines, records
from ..compute import cpushare

log = logging.getLogger("paretopipe.profile")


def parser(prog: str = "python -m paretopipe.profile") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Measure a device profile of a model on this device: compute time of every segment "
                    "between fine cuts, activation bytes, FLOPs and codec costs. Run once per device; feed "
                    "the files to python -m paretopipe.predict --device-profiles.",
        epilog=example_epilog(
            "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --out profiles/server-mobilenet_v2.json",
            "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --cpu-share 0.25 "
            "--out profiles/edge-mobilenet_v2.json   # an emulated weaker device",
            "python -m paretopipe.profile --model resnet50 --device cuda --batch-sizes 1,8 --out profiles/gpu-resnet50.json",
            "python -m paretopipe.profile --model tiny-lm --prompt-len 16,128 --threads 1 --out profiles/cpu-tiny-lm.json"))
    flags.MODEL.add_to(p, default=None)
    flags.MODEL_DIR.add_to(p)
    p.add_argument("--batch-sizes", default="1", help="comma list of batch sizes to time")
    for row in (flags.DEVICE, flags.THREADS, flags.CPUS):
        row.add_to(p)
    flags.CPU_SHARE.add_to(p, help="hold this process to a CPU share via cgroups (emulates a weaker device; as "
                                   "--stage-cpu)")
    flags.WARMUP.add_to(p, help="untimed passes first")
    p.add_argument("--repetitions", type=positive_int, default=None,
                   help="timed passes; the median (mean under a share) is kept (default 15; a language model's "
                        "prefills: 5)")
    p.add_argument("--codecs", default=",".join(DEFAULT_CODECS),
                   help="wire-dtype/compression pairs to time on every cut (float32/none is always timed)")
    p.add_argument("--ciphers", default="chacha20,aesgcm",
                   help="data-port ciphers whose seal and open times to measure, for predict --encrypt (none: skip)")
    add_dataset_flags(p, default="photos")
    flags.ENGINE.add_to(p, help=flags.ENGINE.help + "; under an engine each segment, the whole model and each block "
                        "split's two stages are timed as exports of their own (an engine fuses operators across "
                        "segments)")
    flags.MAX_LIVE.add_to(p, help="profile every cut that at most this many tensors cross (a live set: skip connections, a "
                        "detector's pyramid), so that predict --fine weighs them too; 1 is the one-tensor cuts")
    flags.NUM_CLASSES.add_to(p)
    flags.WEIGHTS.add_to(p)
    g = p.add_argument_group(f"{LANGUAGE_MODELS}: every block's compute in each phase")
    flags.PROMPT_LENS.add_to(g, help="prompt lengths whose prefill is timed, a comma list (128,1024)")
    g.add_argument("--decode-steps", type=positive_int, default=16, help="decode steps timed after each prefill")
    flags.OUT.add_to(p, required=True, help="device profile JSON to write, e.g. profiles/<device>-<model>.json")
    add_common_flags(p)
    return p


#: A profile's options that only one kind of model takes (their dests).
IMAGE_ONLY = ("batch_sizes", "codecs", "ciphers", "dataset", "data_dir", "max_live", "num_classes", "weights", "device",
              "engine")
GENERATION_ONLY = ("prompt_len", "decode_steps")


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.profile") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.model is None and args.model_dir is None:
        raise UsageError("give --model NAME (or --model-dir DIR for a language model's folder)")
    kind = workload_of(args.model, args.model_dir)
    check_workload_flags(p, args, kind, {IMAGES.name: IMAGE_ONLY, GENERATION.name: GENERATION_ONLY})
    if args.cpu_share is not None:
        cpushare.check_share(args.cpu_share)
        if args.threads is None:  # torch's default, every core, under a fraction of one
            args.threads = cpushare.threads_within(args.cpu_share, os.cpu_count() or 1)
    return {IMAGES: _profile_image_model, GENERATION: _profile_language_model}[kind](args)


def _profile_image_model(args: argparse.Namespace) -> int:
    # lazy for start-up: torch
    from ..predict.measure import ProfileOptions, measure

    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: give a comma list of integers like 1,8")
    opts = ProfileOptions(model=args.model, batch_sizes=sizes, device=args.device, threads=args.threads,
                          cpus=args.cpus, cpu_share=args.cpu_share, warmup=args.warmup,
                          repetitions=args.repetitions or 15, max_live=args.max_live,
                          codecs=[c.strip() for c in args.codecs.split(",") if c.strip()],
                          ciphers=[c.strip() for c in args.ciphers.split(",") if c.strip() and c.strip() != "none"],
                          num_classes=args.num_classes, weights=args.weights,
                          dataset=dataset_from_args(args), data_dir=args.data_dir, engine=args.engine)
    if args.engine != "torch":
        engines.require(args.engine)
    doc = measure(opts, progress=log.info)
    path = records.atomic_write_json(args.out, doc)
    for b, per in doc["by_batch"].items():
        total = sum(per["segment_compute_s"])
        print(f"batch {b}: {len(per['segment_compute_s'])} segments sum to {total * 1e3:.2f} ms; the whole model "
              f"takes {per['whole_model_s'] * 1e3:.2f} ms (ratio {total / per['whole_model_s']:.3f})")
    print(f"device profile written: {path}")
    return 0


def _profile_language_model(args: argparse.Namespace) -> int:
    """Every block's compute in the prefill of each prompt length and in the decode steps after it."""
    # lazy for start-up: torch, transformers
    from ..llm.build import source
    # lazy for start-up: torch
    from ..llm.phase_profile import profile
    # lazy for start-up: torch
    from ..partition.stages import apply_cpu_limits

    limits = apply_cpu_limits(args.cpus, args.threads)
    src = source(None if args.model_dir else args.model, args.model_dir)
    for plen in args.prompt_len:
        if plen + args.decode_steps > src.shape.max_position_embeddings:
            raise UsageError(f"--prompt-len {plen} and {args.decode_steps} decode steps exceed the model's "
                             f"{src.shape.max_position_embeddings} positions")
    with cpushare.limited(args.cpu_share, "profile") as applied:
        data = profile(src, args.prompt_len, args.decode_steps, args.repetitions or 5, args.threads)
    data["limits"] = {**limits, **applied}
    path = records.atomic_write_json(Path(args.out), data)
    for plen, ph in data["prompt_lens"].items():
        print(f"{src.name} prompt {plen}: prefill {sum(ph['prefill_s']) * 1e3:.2f} ms, decode step "
              f"{sum(ph['decode_s']) * 1e3:.2f} ms over {len(data['blocks'])} blocks")
    print(f"device profile written: {path}")
    return 0
