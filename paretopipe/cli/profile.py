"""``paretopipe profile`` (and ``python -m paretopipe.profile``): measure a device profile."""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from ..runners import flags
from . import lm_predict, lm_stages
from ..errors import UsageError
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_dataset_flags, dataset_from_args,
                     example_epilog, nonneg_int, positive_int, setup_logging)
from ..predict.device_profile import DEFAULT_CODECS
from .. import cpushare, records

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
            "python -m paretopipe.profile --model resnet50 --device cuda --batch-sizes 1,8 --out profiles/gpu-resnet50.json"))
    flags.MODEL.add_to(p, required=True)
    p.add_argument("--batch-sizes", default="1", help="comma list of batch sizes to time")
    for row in (flags.DEVICE, flags.THREADS, flags.CPUS):
        row.add_to(p)
    flags.CPU_SHARE.add_to(p, help="hold this process to a CPU share via cgroups (emulates a weaker device; as "
                                   "--stage-cpu)")
    p.add_argument("--warmup", type=nonneg_int, default=3, help="untimed passes first")
    p.add_argument("--repetitions", type=positive_int, default=15, help="timed passes; the median (mean under a share) is kept")
    p.add_argument("--codecs", default=",".join(DEFAULT_CODECS),
                   help="wire-dtype/compression pairs to time on every cut (float32/none is always timed)")
    p.add_argument("--ciphers", default="chacha20,aesgcm",
                   help="data-port ciphers whose seal and open times to measure, for predict --encrypt (none: skip)")
    add_dataset_flags(p, default="photos")
    p.add_argument("--max-live", type=positive_int, default=1,
                   help="profile every cut that at most this many tensors cross (a live set: skip connections, a "
                        "detector's pyramid), so that predict --fine weighs them too; 1 is the one-tensor cuts")
    flags.NUM_CLASSES.add_to(p)
    flags.WEIGHTS.add_to(p)
    p.add_argument("--out", required=True, help="device profile JSON to write, e.g. profiles/<device>-<model>.json")
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m paretopipe.profile") -> int:
    if lm_stages.wants_lm(argv if argv is not None else sys.argv[1:]):
        return lm_predict.profile_main(argv, prog)
    # lazy for start-up: torch
    from ..predict.measure import ProfileOptions, measure

    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: give a comma list of integers like 1,8")
    if args.cpu_share is not None:
        cpushare.check_share(args.cpu_share)
    opts = ProfileOptions(model=args.model, batch_sizes=sizes, device=args.device, threads=args.threads,
                          cpus=args.cpus, cpu_share=args.cpu_share, warmup=args.warmup,
                          repetitions=args.repetitions, max_live=args.max_live,
                          codecs=[c.strip() for c in args.codecs.split(",") if c.strip()],
                          ciphers=[c.strip() for c in args.ciphers.split(",") if c.strip() and c.strip() != "none"],
                          num_classes=args.num_classes, weights=args.weights,
                          dataset=dataset_from_args(args), data_dir=args.data_dir)
    doc = measure(opts, progress=log.info)
    path = records.atomic_write_json(args.out, doc)
    for b, per in doc["by_batch"].items():
        total = sum(per["segment_compute_s"])
        print(f"batch {b}: {len(per['segment_compute_s'])} segments sum to {total * 1e3:.2f} ms; the whole model "
              f"takes {per['whole_model_s'] * 1e3:.2f} ms (ratio {total / per['whole_model_s']:.3f})")
    print(f"device profile written: {path}")
    return 0
