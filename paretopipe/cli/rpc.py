"""``distributed_runner.py`` and ``paretopipe rpc``: the RPC backend with the anchor's flags
(rank 0 = master, 1..N-1 = workers)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from ..options import flags
from ..controller import rpc_ranks
from ..llm.families import model_structure
from ..llm.shapes import workload_of
from .workload_flags import (add_generation_flags, check_workload_flags, generation_from_args, generation_line,
                             loadgen_line, save_tokens)
from ..errors import PeerError, UsageError
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_dataset_flags, add_loadgen_flags,
                     add_network_flags, add_prefetch_flags, dataset_from_args, loadgen_from_args, example_epilog, network_from_args, nonneg_int, port_number,
                     positive_float, positive_int, read_env, run_config_from_flags, save_outputs, setup_logging)
from ..splitspec import check_splits
from ..network import deadlines
from ..transport.runconfig import RpcOptions
from .. import records

log = logging.getLogger("paretopipe.rpc")
DEPRECATED = {"--use-local-loading": "every worker always builds its own stage locally"}


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
    p.add_argument("--rank", type=nonneg_int, default=0, help="0 = master, 1..N-1 = workers")
    p.add_argument("--world-size", type=positive_int, default=3)
    flags.MODEL.add_to(p, default="mobilenetv2", aliases=("--model-name",))
    flags.BATCH_SIZE.add_to(p)
    flags.NUM_CLASSES.add_to(p)
    add_dataset_flags(p)
    add_prefetch_flags(p)
    p.add_argument("--num-test-samples", type=positive_int, default=64, help="images in the measured batches")
    flags.WARMUP.add_to(p, default=2)
    flags.SEED.add_to(p)
    flags.WIRE_DTYPE.add_to(p, help="a language model's hidden state across each cut (an image model's activations "
                                    "cross as computed over RPC)")
    p.add_argument("--num-partitions", type=positive_int, default=None,
                   help="stages; at most world-size - 1 (world-size with --rpc-source stage1); default: one more than "
                        "the cuts --split-blocks or --cut name, else 2")
    flags.SPLIT.add_to(p, aliases=("--split-block",), dest="split_block", help="block index k for 2 partitions (0..K)")
    flags.SPLIT_BLOCKS.add_to(p)
    flags.CUT.add_to(p)
    p.add_argument("--use-pipelining", action="store_true", help="keep --in-flight batches outstanding")
    flags.IN_FLIGHT.add_to(p, default=4)
    p.add_argument("--num-threads", type=positive_int, default=16,
                   help="RPC worker threads (the anchor's default is 4; 16 here because each stage's forward holds "
                        "an RPC thread while it waits for the stage, and with --in-flight 4 batches plus the "
                        "results coming back, 4 threads can all be waiting)")
    _add_split_choice_flags(p)
    _add_placement_flags(p)
    add_generation_flags(p)
    add_loadgen_flags(p)
    return p


def _add_split_choice_flags(p: ArgumentParser) -> None:
    s = p.add_argument_group("choosing the split (the anchor's flags)")
    s.add_argument("--use-intelligent-splitting", action="store_true",
                   help="choose the block split with the lowest modelled latency under the run's network "
                        "conditions, from --device-profiles or a quick self-profile; the prediction is recorded "
                        "beside the measurement (2 partitions)")
    s.add_argument("--disable-intelligent-splitting", action="store_true",
                   help="use the split given (--split-block) or the default K//2 (the default behaviour)")
    flags.DEVICE_PROFILES.add_to(s, help="stage 1's and stage 2's profiles (paretopipe profile), comma-separated, for "
                        "--use-intelligent-splitting")


def _add_placement_flags(p: ArgumentParser) -> None:
    """Where the ranks run and what they write: the RPC transport, the master, the network."""
    flags.THREADS.add_to(p, help="torch intra-op threads per process")
    flags.OUT.add_to(p, aliases=("--metrics-dir",), default="./enhanced_metrics", help="folder for the run JSON")
    for row in (flags.MODELS_DIR, flags.MODEL_DIR, flags.WEIGHTS, flags.DEVICE, flags.RPC_TRANSPORT, flags.RPC_SOURCE):
        row.add_to(p)
    flags.STAGE_DEVICES.add_to(p, help="master: the device of each stage, e.g. cpu,cuda (the master builds every rank's stage "
                        "there; default: --device for every stage)")
    p.add_argument("--master-addr", default=None, help="overrides MASTER_ADDR from .env/environment")
    p.add_argument("--master-port", type=port_number, default=None, help="overrides MASTER_PORT")
    flags.TIMEOUT.add_to(p, help="seconds per result (default: follows the link: 60 s plus what the batches in flight need "
                        "at its slowest rate)")
    p.add_argument("--join-timeout", type=positive_float, default=None,
                   help="seconds for every rank to start, build its model and join (default 60, or --timeout if "
                        "longer): start-up on a loaded machine, not the link")
    add_network_flags(p.add_argument_group("emulated network conditions on every hop"))
    flags.LOCAL.add_to(p, help="spawn every rank as a process on this machine")
    flags.SAVE_OUTPUTS.add_to(p, help="master: " + flags.SAVE_OUTPUTS.help)
    flags.ENV_FILE.add_to(p)
    p.add_argument("--shards-dir", default=None, help=argparse.SUPPRESS)
    for flag in DEPRECATED:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    add_common_flags(p)


def _master_address(args: argparse.Namespace) -> tuple[str, int]:
    import os

    values = read_env(args.env_file)
    for key in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        if values.get(key) and key not in os.environ:
            os.environ[key] = values[key]
    addr = args.master_addr or values.get("MASTER_ADDR") or "127.0.0.1"
    port = args.master_port or values.get("MASTER_PORT") or 29500
    try:
        port = int(port)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise UsageError(f"MASTER_PORT={port!r} is not a TCP port (1..65535)")
    return addr, port


def _split_blocks(args: argparse.Namespace, num_blocks: int) -> list[int]:
    if args.split_blocks:
        try:
            ks = [int(k) for k in args.split_blocks.split(",")]
        except ValueError:
            raise UsageError(f"--split-blocks {args.split_blocks!r}: give a comma list of integers like 5,12")
    else:
        ks = [args.split_block if args.split_block is not None else num_blocks // 2]
    if len(ks) != args.num_partitions - 1:
        raise UsageError(f"{args.num_partitions} partitions need {args.num_partitions - 1} split block(s), got {ks}")
    if ks != sorted(ks):
        raise UsageError(f"--split-blocks must be in increasing order, got {ks}")
    return ks


def _check_layout(args: argparse.Namespace) -> None:
    """The world, the partitions, the rank and the data's place must fit together (the number of
    partitions, when not given, follows from the cuts named)."""
    if args.num_partitions is None:
        named = args.split_blocks or args.cut
        args.num_partitions = len(named.split(",")) + 1 if named else 2
    ranks_needed = args.num_partitions + (1 if args.rpc_source == "master" else 0)
    if args.world_size < 2:
        raise UsageError(f"--world-size {args.world_size}: must be at least 2 (a master and one worker)")
    if ranks_needed > args.world_size:
        limit = args.world_size - (1 if args.rpc_source == "master" else 0)
        raise UsageError(f"--num-partitions {args.num_partitions} must be within 1..{limit} for --world-size "
                         f"{args.world_size} with --rpc-source {args.rpc_source}")
    if not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank {args.rank} must be within 0..{args.world_size - 1}")
    if args.cut is not None and (args.split_blocks or args.split_block is not None or _intelligent(args)):
        raise UsageError("--cut names the cuts itself: drop --split-block/--split-blocks/--use-intelligent-splitting")
    if args.cut is not None and len(args.cut.split(",")) != args.num_partitions - 1:
        raise UsageError(f"{args.num_partitions} partitions need {args.num_partitions - 1} cut(s), got --cut {args.cut}")
    if _intelligent(args) and (args.num_partitions != 2 or args.split_blocks or args.split_block is not None):
        raise UsageError("--use-intelligent-splitting chooses the one split of 2 partitions: drop --split-block/"
                         "--split-blocks and use --num-partitions 2 (for N devices: paretopipe predict --devices)")
    if args.rank != 0 and (args.stage_devices or args.device != "cpu"):
        raise UsageError(f"--device/--stage-devices on rank {args.rank}: the master builds every rank's stage; give "
                         f"--stage-devices (one device per stage) to rank 0")
    if args.rank == 0 and args.cut is None:  # the split and the model are checked before any rank starts
        shape = model_structure(args.model, args.num_classes, args.model_dir)
        num_blocks = shape["num_blocks"]
        check_splits(_split_blocks(args, num_blocks), num_blocks, shape["model"])


def _intelligent(args: argparse.Namespace) -> bool:
    return args.use_intelligent_splitting and not args.disable_intelligent_splitting


def _rank_options(args: argparse.Namespace) -> Any:
    """This rank's options, with the master's address (a free loopback port for --local)."""
    import socket


    addr, port = _master_address(args)
    if args.local and args.rank == 0:
        addr = "127.0.0.1"
        if args.master_port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
    return rpc_ranks.RankOptions(rank=args.rank, world_size=args.world_size, master_addr=addr, master_port=port,
                                 model=args.model, model_dir=args.model_dir, num_classes=args.num_classes,
                                 weights=args.weights, models_dir=args.models_dir, device=args.device,
                                 threads=args.threads, transport=args.rpc_transport, rpc_threads=args.num_threads,
                                 join_timeout=args.join_timeout or max(args.timeout or 0.0, deadlines.BASE_S),
                                 source=args.rpc_source, rank_devices=_rank_devices(args))


def _rank_devices(args: argparse.Namespace) -> str | None:
    """``--stage-devices`` as each rank's device (the stages' ranks by the layout; the master's own
    --device where it holds no stage)."""
    if not args.stage_devices:
        return None
    devices = [d.strip() for d in args.stage_devices.split(",")]
    if len(devices) != args.num_partitions:
        raise UsageError(f"--stage-devices {args.stage_devices}: give one device per stage ({args.num_partitions})")
    # lazy for start-up: torch
    from ..transport.rpc import layout

    per_rank = [args.device] * args.world_size
    for stage, rank in enumerate(layout(args.num_partitions, args.rpc_source)):
        per_rank[rank] = devices[stage]
    return ",".join(per_rank)


class _MasterRun:
    """Rank 0's one run, once every rank has joined: choose the split (the anchor's intelligent
    splitting, if asked), run it, write its record and report it in one line."""

    def __init__(self, args: argparse.Namespace, conditions: Any, procs: list) -> None:
        self.args, self.conditions, self.procs = args, conditions, procs

    def config(self, builder: Any, ks: list[int] | None) -> Any:
        """The run's configuration for block splits ``ks``, or (None) for the fine cuts of ``--cut``:
        image batches, or a language model's generation."""
        args, part = self.args, builder.partitioner
        cuts = [part.block_cut(k) for k in ks] if ks is not None else builder.cuts_for(cut=args.cut)
        split_index = None if ks is None else ks[0] if len(ks) == 1 else ks
        in_flight = args.in_flight if args.use_pipelining else 1
        rpc = RpcOptions(transport=args.rpc_transport, source=args.rpc_source, use_pipelining=args.use_pipelining,
                         world_size=args.world_size)
        if workload_of(args.model, args.model_dir).generates:
            generation = generation_from_args(args)
            up = max(part.payload_nbytes(c, max(map(len, builder.prompts(generation, args.seed)))) for c in cuts)
            timeout_s = args.timeout or deadlines.run_timeout_s(self.conditions, up, 64, generation.streams)
            return run_config_from_flags(args, builder.name, cuts, split_index, self.conditions, timeout_s,
                                         generation=generation, rpc=rpc, wire_dtype=args.wire_dtype, seed=args.seed,
                                         loadgen=loadgen_from_args(args))
        up = max(part.payload_nbytes(c, args.batch_size) for c in cuts)
        timeout_s = args.timeout or deadlines.run_timeout_s(self.conditions, up, args.num_classes * 4 * args.batch_size,
                                                            in_flight)
        if args.wire_dtype != "float32":
            raise UsageError(f"--wire-dtype {args.wire_dtype}: over RPC an image model's activations cross as "
                             f"computed (float32); a cast on the wire is the TCP backend's (partition1.py)")
        return run_config_from_flags(args, builder.name, cuts, split_index, self.conditions,
                                     timeout_s, num_batches=max(1, -(-args.num_test_samples // args.batch_size)),
                                     in_flight=in_flight, dataset=dataset_from_args(args), seed=args.seed,
                                     loadgen=loadgen_from_args(args), rpc=rpc)

    def __call__(self, builder: Any, group: Any, transport: dict[str, Any]) -> int:
        # lazy for start-up: torch
        from ..transport import rpc as backend

        args, procs = self.args, self.procs
        choice = None
        if _intelligent(args):
            # lazy for start-up: pandas
            from ..controller.intelligent import choose_split

            args.split_block, choice = choose_split(builder, args.batch_size, self.conditions,
                                                    args.device_profiles.split(",") if args.device_profiles else None)
        ks = _split_blocks(args, builder.partitioner.num_blocks) if args.cut is None else None
        cfg = self.config(builder, ks)
        try:
            record, outputs = backend.run_master(cfg, builder, group, source=args.rpc_source, conditions=self.conditions,
                                                 keep_outputs=bool(args.save_outputs), transport=transport,
                                                 check_alive=rpc_ranks.check_alive_of(procs) if procs else None)
        except PeerError as exc:  # a rank built something else: nothing ran
            print(f"error: {exc}", file=sys.stderr, flush=True)
            rpc_ranks.hard_exit(procs, 1)
        if choice is not None:
            record["manifest"]["split_choice"] = choice
        path = records.write_run_json(Path(args.out) / f"{record['run_id']}.json", record)
        if record["status"] != "complete":
            print(f"error: {record['error']} (incomplete record written to {path})", file=sys.stderr, flush=True)
            rpc_ranks.hard_exit(procs, 1)
        if args.save_outputs:
            save_tokens(args.save_outputs, record["generation"]["tokens"]) if cfg.workload.generates \
                else save_outputs(args.save_outputs, outputs)
        backend.rpc.shutdown()
        for proc in procs:
            proc.wait(cfg.timeout_s)
        print(self.report(record, builder, ks, cfg.cuts, choice, path))
        return 0

    @staticmethod
    def report(record: dict[str, Any], builder: Any, ks: list[int] | None, cuts: list[str], choice: dict | None,
               path: Path) -> str:
        s = record["summary"]
        if record.get("generation"):
            text = builder.tokenizer.decode(record["generation"]["tokens"][0])
            return f"{record['config']['model']} cuts={cuts} rpc {generation_line(record, text)}, written {path}"
        line = ""
        if choice is not None:
            mine = next(p for p in choice["predicted"] if p["split"] == ks[0])
            line = (f"intelligent splitting chose k={ks[0]}: predicted latency {mine['predicted_latency_s'] * 1e3:.2f} "
                    f"ms, measured {s['latency_median_s'] * 1e3:.2f} ms\n")
        lg = f", {loadgen_line(record)}" if record.get("loadgen") else ""
        return (line + f"{record['config']['model']} cuts={cuts} rpc latency median {s['latency_median_s'] * 1e3:.2f} "
                f"ms, throughput {s['throughput_imgs_per_s']:.1f} img/s{lg}, written {path}")


def main(argv: Sequence[str] | None = None, prog: str = "distributed_runner.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser(prog)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    check_workload_flags(p, args, workload_of(args.model, args.model_dir))
    for flag, note in DEPRECATED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")):
            log.warning("%s is deprecated and ignored: %s", flag, note)
    if args.shards_dir:
        log.warning("--shards-dir is deprecated and ignored: no module is ever shipped; workers build their stage")
    _check_layout(args)
    conditions = network_from_args(args)
    opts = _rank_options(args)
    if args.rank != 0:
        return rpc_ranks.serve_rank(opts)
    procs = rpc_ranks.spawn_local(opts) if args.local else []
    return rpc_ranks.serve_rank(opts, one_run=_MasterRun(args, conditions, procs), procs=procs)


if __name__ == "__main__":
    from .common import run_cli

    raise SystemExit(run_cli(main))
