"""``distributed_runner.py`` and ``paretopipe rpc``: the RPC backend with the anchor's flags
(rank 0 = master, 1..N-1 = workers)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ..errors import UsageError
from .common import ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog, setup_logging

log = logging.getLogger("paretopipe.rpc")
DEPRECATED = {"--use-local-loading": "every worker always builds its own stage locally",
              "--use-intelligent-splitting": "use --split-block/--split-blocks (see python -m paretopipe.split --list)"}


def parser(prog: str = "distributed_runner.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="N-stage pipeline over torch.distributed.rpc. Rank 0 (master) holds the data and "
                    "receives results; ranks 1..N-1 each run one stage, forwarding straight to the next. "
                    "Only connect trusted hosts: PyTorch RPC pickles arguments on its wire.",
        epilog=example_epilog(
            "python distributed_runner.py --local --world-size 3 --model mobilenetv2 --split-block 8",
            "python distributed_runner.py --local --world-size 4 --num-partitions 3 --model resnet18 --split-blocks 3,6 --use-pipelining",
            "python distributed_runner.py --rank 1 --world-size 3 --model mobilenetv2 --split-block 8   # on worker 1",
            "python distributed_runner.py --rank 0 --world-size 3 --model mobilenetv2 --split-block 8   # on the master"))
    p.add_argument("--rank", type=int, default=0, help="0 = master, 1..N-1 = workers")
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--dataset", default="dummy", choices=["dummy", "cifar10"])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--num-test-samples", type=int, default=64, help="images in the measured batches")
    p.add_argument("--warmup", type=int, default=2, help="extra batches first, excluded from statistics")
    p.add_argument("--num-partitions", type=int, default=2, help="stages; at most world-size - 1")
    p.add_argument("--split-block", type=int, default=None, help="block index k for 2 partitions (0..K)")
    p.add_argument("--split-blocks", default=None, help="comma list of k for more partitions, e.g. 5,12")
    p.add_argument("--use-pipelining", action="store_true", help="keep --in-flight batches outstanding")
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--num-threads", type=int, default=16, help="RPC worker threads")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads per process")
    p.add_argument("--metrics-dir", default="./enhanced_metrics")
    p.add_argument("--models-dir", default="./models")
    p.add_argument("--weights", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rpc-transport", default="uv", choices=["uv", "auto"],
                   help="uv: TCP even on one host (default); auto: TensorPipe may use shared memory")
    p.add_argument("--master-addr", default=None, help="overrides MASTER_ADDR from .env/environment")
    p.add_argument("--master-port", type=int, default=None, help="overrides MASTER_PORT")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds: joining, and per result")
    add_network_flags(p.add_argument_group("emulated network conditions on every hop"))
    p.add_argument("--network-label", default=None, help=argparse.SUPPRESS)
    p.add_argument("--run-key", default=None, help=argparse.SUPPRESS)
    p.add_argument("--config-key", default=None, help=argparse.SUPPRESS)
    p.add_argument("--run", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--local", action="store_true", help="spawn every rank as a process on this machine")
    p.add_argument("--save-outputs", default=None, help="master: write the logits to this .npz")
    p.add_argument("--env-file", default=".env")
    p.add_argument("--shards-dir", default=None, help=argparse.SUPPRESS)
    for flag in DEPRECATED:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    add_common_flags(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "distributed_runner.py") -> int:
    from ..runners import rpc_ranks

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    for flag, note in DEPRECATED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")):
            log.warning("%s is deprecated and ignored: %s", flag, note)
    if args.shards_dir:
        log.warning("--shards-dir is deprecated and ignored: no module is ever shipped; workers build their stage")
    return rpc_ranks.run(args, argv)


if __name__ == "__main__":
    from .common import run_cli

    raise SystemExit(run_cli(main))
