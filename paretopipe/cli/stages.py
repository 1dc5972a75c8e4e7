"""Command-line faces of the TCP backend: ``partition1.py`` (stage 1) and ``partition2.py`` (stage 2)."""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Sequence

import numpy as np
import torch

from ..errors import UsageError
from ..partition.stages import StageBuilder
from ..transport import tcp, wire
from ..transport.runconfig import RunConfig
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog,
                     network_from_args, setup_logging)

log = logging.getLogger("paretopipe.tcp")
DEFAULT_PORT = 5555


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and split (both stages must agree)")
    g.add_argument("--model-name", "--model", dest="model", default="mobilenetv2",
                   help="zoo name (mobilenetv2, resnet18, resnet50, vgg16, alexnet, inceptionv3, any torchvision name)")
    g.add_argument("--split-index", type=int, default=None,
                   help="anchor block index k: the first k blocks run on stage 1 (0 and K are the baselines)")
    g.add_argument("--cut", default=None, help="fine fx cut name instead of --split-index (see python -m paretopipe.split --list --fine)")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--num-classes", type=int, default=10)
    g.add_argument("--weights", default=None, help="state-dict .pth to load (default: models/<name>.pth if present, else deterministic init)")
    g.add_argument("--models-dir", default=None, help="folder searched for <name>.pth (default ./models)")
    n = parser.add_argument_group("connection")
    n.add_argument("--port", type=int, default=DEFAULT_PORT)
    n.add_argument("--timeout", type=float, default=60.0, help="seconds without progress before the run is declared dead")
    n.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the peer to appear")
    n.add_argument("--max-payload", type=int, default=wire.DEFAULT_MAX_PAYLOAD, help="largest frame payload accepted, bytes")
    r = parser.add_argument_group("execution and output")
    r.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    r.add_argument("--threads", type=int, default=None, help="torch intra-op threads on this node")
    r.add_argument("--output-dir", default=None, help="folder for the run JSON")
    r.add_argument("--link-dev", default=None, help="with --link tc: interface whose qdiscs are read back into the manifest")
    add_common_flags(parser)


def _builder(args: argparse.Namespace) -> tuple[StageBuilder, list[str]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    builder = StageBuilder(args.model, args.num_classes, args.weights, args.models_dir, args.device)
    if args.split_index is None and args.cut is None:
        raise UsageError(f"give --split-index (0..{builder.partitioner.num_blocks} for {builder.name}) or --cut NAME")
    return builder, builder.cuts_for(args.split_index, args.cut)


def _observed_link(args: argparse.Namespace) -> dict | None:
    if getattr(args, "link", None) != "tc":
        return None
    from ..network import tc

    if not args.link_dev:
        raise UsageError("--link tc needs --link-dev IFACE so the applied qdiscs can be read back")
    return tc.observed_link_state(args.link_dev)


def _sigterm_as_interrupt() -> None:
    # The sweeper and partition.sh stop stages with SIGTERM; treat it like Ctrl-C so the JSON
    # is still written and sockets are closed.
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def stage1_parser(prog: str = "partition1.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Stage 1 of a 2-stage TCP pipeline: the data source. Listens, runs the first "
                    "part of the model, sends activations to stage 2, receives results and measures "
                    "end-to-end latency on its own monotonic clock.",
        epilog=example_epilog(
            "python partition1.py --model-name mobilenetv2 --split-index 8",
            "python partition1.py --model-name resnet50 --split-index 4 --in-flight 4 --network lte",
            "python partition1.py --model-name vgg16 --cut features_16 --compression zstd --wire-dtype float16"))
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    _common(p)
    d = p.add_argument_group("workload")
    d.add_argument("--num-batches", type=int, default=20, help="measured batches")
    d.add_argument("--warmup", type=int, default=3, help="extra batches first, excluded from statistics")
    d.add_argument("--in-flight", type=int, default=1, help="pipelining window (1 = no overlap)")
    d.add_argument("--dataset", default="synthetic", choices=["synthetic", "cifar10"])
    d.add_argument("--data-dir", default=None, help="folder holding cifar-10-batches-py")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--compression", default="none", choices=list(wire.CODECS))
    d.add_argument("--compression-level", type=int, default=3)
    d.add_argument("--wire-dtype", default="float32", choices=list(wire.WIRE_DTYPES))
    k = p.add_argument_group("network conditions")
    add_network_flags(k)
    k.add_argument("--link", default=None, choices=["emulated", "tc", "none"],
                   help="emulated: in-process link for --network (default when one is given); tc: shaped by network_delay.py")
    k.add_argument("--network-delay-ms", type=float, default=None, help="anchor label only; the manifest records the link actually used")
    p.add_argument("--save-outputs", default=None, help="write the returned logits to this .npz (for checks)")
    return p


def main_stage1(argv: Sequence[str] | None = None, prog: str = "partition1.py") -> int:
    args = stage1_parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    _sigterm_as_interrupt()
    builder, cuts = _builder(args)
    conditions = network_from_args(args)
    link_mode = args.link or ("emulated" if conditions else "none")
    cfg = RunConfig(model=builder.name, cuts=cuts, split_index=args.split_index, batch_size=args.batch_size,
                    num_batches=args.num_batches, warmup=args.warmup, in_flight=args.in_flight,
                    dataset=args.dataset, data_dir=args.data_dir, num_classes=args.num_classes,
                    wire_dtype=args.wire_dtype, compression=args.compression,
                    compression_level=args.compression_level, seed=args.seed,
                    network=conditions.name if conditions else None,
                    link_mode=link_mode, network_delay_ms_label=args.network_delay_ms, timeout_s=args.timeout)
    observed = _observed_link(args)
    listener = tcp.listen(args.host, args.port)
    log.info("stage 1 listening on %s:%d (%s, cuts %s)", args.host, args.port, builder.name, cuts)
    try:
        outcome = tcp.run_stage1(listener, builder, cfg, conditions=conditions, connect_timeout=args.connect_timeout,
                                 output_dir=args.output_dir, keep_outputs=bool(args.save_outputs),
                                 observed_link=observed, threads=args.threads, max_payload=args.max_payload)
    finally:
        listener.close()
    if args.save_outputs:
        np.savez(args.save_outputs, logits=torch.stack(outcome.outputs).numpy())
    s = outcome.record["summary"]
    print(f"{builder.name} cuts={cuts} latency median {_ms(s['latency_median_s'])} p95 {_ms(s['latency_p95_s'])}, "
          f"throughput {_num(s['throughput_imgs_per_s'])} img/s, payload {_num(s['payload_bytes_mean'])} B"
          + (f", written {outcome.path}" if outcome.path else ""))
    return 0


def stage2_parser(prog: str = "partition2.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Stage 2 of a 2-stage TCP pipeline: connects to stage 1, runs the rest of the "
                    "model, returns every result, and writes the run JSON into --output-dir.",
        epilog=example_epilog("python partition2.py --model-name mobilenetv2 --split-index 8 --host 192.168.1.10",
                              "python partition2.py --model-name resnet50 --split-index 4 --host 127.0.0.1 --device cuda"))
    p.add_argument("--host", default="127.0.0.1", help="stage 1's address")
    _common(p)
    p.set_defaults(output_dir=".")
    p.add_argument("--link", default=None, choices=["emulated", "tc", "none"], help=argparse.SUPPRESS)
    return p


def main_stage2(argv: Sequence[str] | None = None, prog: str = "partition2.py") -> int:
    args = stage2_parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    _sigterm_as_interrupt()
    builder, cuts = _builder(args)
    cfg = RunConfig(model=builder.name, cuts=cuts, split_index=args.split_index, batch_size=args.batch_size,
                    num_classes=args.num_classes, timeout_s=args.timeout)
    observed = _observed_link(args)
    sock = tcp.connect_with_retry(args.host, args.port, args.connect_timeout)
    outcome = tcp.run_stage2(sock, builder, cfg, output_dir=args.output_dir, observed_link=observed,
                             threads=args.threads, max_payload=args.max_payload)
    print(f"stage 2 done: {outcome.record['summary']['batches_measured']} measured batches, written {outcome.path}")
    return 0


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"
