"""``distributed_runner.py`` for a language model: the master (rank 0) is stage 1 and holds the
prompts; rank j runs stage j + 1; ``--local`` starts the other ranks on this machine."""

from __future__ import annotations

import argparse
import logging
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import records
from ..errors import UsageError
from ..llm import shapes
from ..llm.tokens import prompt_ids, tokenizer_for
from ..network import deadlines
from ..runners import flags, rpc_ranks
from .lm_stages import add_generation_flags, add_model_flags, per_stage
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog, fmt_ms,
                     fmt_num, network_from_args, nonneg_int, port_number, positive_float, positive_int, read_env,
                     setup_logging)

log = logging.getLogger("paretopipe.rpc")


def parser(prog: str = "distributed_runner.py") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="A split language model over torch.distributed.rpc: rank 0 (the master) is stage 1 "
                                   "and holds the prompts, rank j runs stage j+1, the last rank chooses each token. "
                                   "Only connect trusted hosts: PyTorch RPC pickles arguments on its wire.",
                       epilog=example_epilog("python distributed_runner.py --local --world-size 2 --model tiny-lm "
                                             "--split-blocks 3 --gen-tokens 16",
                                             "python distributed_runner.py --rank 1 --world-size 2 --model tiny-lm "
                                             "--split-blocks 3   # on the worker"))
    p.add_argument("--rank", type=nonneg_int, default=0, help="0 = the master (stage 1), 1..N-1 = later stages")
    p.add_argument("--world-size", type=positive_int, default=2, help="stages: the master and one rank per later stage")
    p.add_argument("--local", action="store_true", help="start ranks 1..N-1 on this machine")
    add_model_flags(p)
    p.add_argument("--split", "--split-block", "--split-blocks", dest="split", default=None,
                   help="k (two stages) or k1,k2,... (one more stage per split)")
    add_generation_flags(p.add_argument_group("generation"))
    p.add_argument("--master-addr", default=None, help="default: MASTER_ADDR from .env, else 127.0.0.1")
    p.add_argument("--master-port", type=port_number, default=None, help="default: MASTER_PORT from .env, else 29500")
    flags.ENV_FILE.add_to(p)
    flags.RPC_TRANSPORT.add_to(p)
    flags.THREADS.add_to(p)
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds without a token before the run is dead")
    p.add_argument("--join-timeout", type=positive_float, default=deadlines.BASE_S,
                   help="seconds for every rank to start, build its stage and join")
    p.add_argument("--out", default="results", help="folder for the run JSON")
    p.add_argument("--save-outputs", default=None, help="write the generated token ids to this .npz (key: tokens)")
    add_network_flags(p)
    add_common_flags(p)
    return p


def _splits(text: str | None) -> list[int]:
    if text is None:
        raise UsageError("give --split-blocks K (python -m paretopipe split --model NAME --list shows the cuts)")
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise UsageError(f"--split-blocks {text!r}: a comma list of integers like 3 or 1,4")


def _address(args: argparse.Namespace) -> tuple[str, int]:
    values = read_env(args.env_file)
    addr = args.master_addr or values.get("MASTER_ADDR") or "127.0.0.1"
    port = args.master_port or int(values.get("MASTER_PORT") or 29500)
    if args.local and args.master_port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        addr = "127.0.0.1"
    return addr, port


def _spawn(argv: Sequence[str], world_size: int, addr: str, port: int) -> list[subprocess.Popen]:
    """Ranks 1..N-1 here: the same command line with its own --rank and the master's address."""
    rest = [a for a in argv if a != "--local"]
    procs = []
    for rank in range(1, world_size):
        procs.append(subprocess.Popen([sys.executable, "-m", "paretopipe", "rpc", *rest, "--rank", str(rank),
                                       "--master-addr", addr, "--master-port", str(port), "--quiet"],
                                      preexec_fn=rpc_ranks._die_with_parent, stdout=subprocess.DEVNULL))
    return procs


def main(argv: Sequence[str] | None, prog: str = "distributed_runner.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    splits = _splits(args.split)
    if args.world_size != len(splits) + 1:
        raise UsageError(f"--world-size {args.world_size}: {len(splits)} split(s) make {len(splits) + 1} stages, "
                         f"one rank each (the master is stage 1)")
    if not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank {args.rank} must be within 0..{args.world_size - 1}")
    import torch  # lazy for start-up: torch

    # lazy for start-up: torch, transformers
    from ..llm.build import source
    # lazy for start-up: torch
    from ..transport import rpc as backend
    # lazy for start-up: torch
    from ..transport import rpc_lm
    # lazy for start-up: torch
    from ..transport.lmrun import LMRunConfig, run_timeout_s

    if args.threads:
        torch.set_num_threads(args.threads)
    src = source(None if args.model_dir else args.model, args.model_dir)
    shapes.check_plan(src.shape, splits)
    conditions = network_from_args(args) if args.rank == 0 else None
    tok = tokenizer_for(args.model_dir)
    prompts = [prompt_ids(args.prompt, args.prompt_len, src.shape.vocab_size, src.shape.max_position_embeddings,
                          args.gen_tokens, tok, args.seed, s) for s in range(args.streams)]
    addr, port = _address(args)
    procs = _spawn(argv, args.world_size, addr, port) if args.local and args.rank == 0 else []
    rpc_lm.set_source(src, args.rank)
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    what = (f"rank {args.rank} could not join the master at {addr}:{port}" if args.rank else
            f"not all {args.world_size} ranks joined at {addr}:{port}")
    dog = rpc_ranks.watchdog(args.join_timeout, what, procs)
    transport = backend.init(args.rank, args.world_size, addr, port, args.rpc_transport, 16, args.join_timeout)
    dog.cancel()
    if args.rank != 0:
        backend.rpc.shutdown()
        return 0
    cfg = LMRunConfig(model=src.name, identity=src.identity(), splits=splits, gen_tokens=args.gen_tokens,
                      streams=args.streams, prompt_tokens=[len(p) for p in prompts], cut_dtype=args.cut_dtype,
                      seed=args.seed, warmup=args.warmup,
                      power_idle_w=per_stage(args.power_idle_w, "--power-idle-w", len(splits) + 1),
                      power_core_w=per_stage(args.power_core_w, "--power-core-w", len(splits) + 1),
                      timeout_s=args.timeout or run_timeout_s(src.shape, conditions, max(len(p) for p in prompts), splits[0],
                                                              args.cut_dtype, args.streams),
                      network=conditions.name if conditions else None)
    try:
        record = rpc_lm.run_master(cfg, prompts, args.world_size, conditions=conditions, threads=args.threads,
                                   transport=transport)
    except Exception as exc:  # a rank built another model, or is gone: nothing more can run in this group
        print(f"error: {exc}", file=sys.stderr, flush=True)
        rpc_ranks.hard_exit(procs, 1)
    path = records.atomic_write_json(Path(args.out) / f"{record['run_id']}.json", record)
    if record["status"] != "complete":
        print(f"error: {record['error']} (incomplete record written to {path})", file=sys.stderr, flush=True)
        rpc_ranks.hard_exit(procs, 1)
    if args.save_outputs:
        np.savez(args.save_outputs, tokens=np.asarray(record["tokens"], dtype=np.int64))
    backend.rpc.shutdown()
    for proc in procs:
        proc.wait(cfg.timeout_s)
    s = record["summary"]
    print(f"{src.name} split={','.join(map(str, splits))} rpc ttft {fmt_ms(s['ttft_median_s'])}, time per token "
          f"{fmt_ms(s['tpot_median_s'])}, {fmt_num(s['tokens_per_s'])} tokens/s, written {path}")
    return 0

