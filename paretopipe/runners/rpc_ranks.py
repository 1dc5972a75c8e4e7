"""The ranks of an RPC run: spawning local ranks, joining as a worker, driving the run as the master."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from .. import records
from ..errors import PeerError, UsageError
from ..network.conditions import get_conditions
from ..partition.stages import StageBuilder
from ..transport.runconfig import RunConfig

log = logging.getLogger("paretopipe.rpc")
ADHOC = ("delay", "jitter", "loss", "rate", "distribution", "trace")


def _env(args: argparse.Namespace) -> tuple[str, int]:
    from dotenv import dotenv_values

    values = dotenv_values(args.env_file) if os.path.exists(args.env_file) else {}
    for key in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        if values.get(key) and key not in os.environ:
            os.environ[key] = values[key]
    addr = args.master_addr or os.environ.get("MASTER_ADDR") or values.get("MASTER_ADDR") or "127.0.0.1"
    port = args.master_port or os.environ.get("MASTER_PORT") or values.get("MASTER_PORT") or 29500
    try:
        port = int(port)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise UsageError(f"MASTER_PORT={port!r} is not a TCP port (1..65535)")
    return addr, port


def _cuts(args: argparse.Namespace, builder: StageBuilder) -> tuple[list[str], int | list[int]]:
    if args.split_blocks:
        try:
            ks = [int(k) for k in args.split_blocks.split(",")]
        except ValueError:
            raise UsageError(f"--split-blocks {args.split_blocks!r}: give a comma list of integers like 5,12")
    else:
        K = builder.partitioner.num_blocks
        ks = [args.split_block if args.split_block is not None else K // 2]
    if len(ks) != args.num_partitions - 1:
        raise UsageError(f"{args.num_partitions} partitions need {args.num_partitions - 1} split block(s), got {ks}")
    if ks != sorted(ks):
        raise UsageError(f"--split-blocks must be in increasing order, got {ks}")
    cuts = [builder.partitioner.block_cut(k) for k in ks]
    return cuts, (ks[0] if len(ks) == 1 else ks)


def _die_with_parent() -> None:
    # --local workers must never outlive the master: the kernel kills them when it exits.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn_workers(args: argparse.Namespace, argv: list[str], port: int) -> list[subprocess.Popen]:
    keep = [a for a in argv if a not in ("--local",)]
    procs = []
    for rank in range(1, args.world_size):
        cmd = [sys.executable, "-m", "paretopipe.cli.rpc", *keep,
               "--rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        procs.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent, stdout=subprocess.DEVNULL))
    return procs


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Act as ``args.rank`` (with ``--local``, rank 0 spawns the others here); returns the exit status."""
    if args.world_size < 2:
        raise UsageError("--world-size must be at least 2 (a master and one worker)")
    if not 1 <= args.num_partitions <= args.world_size - 1:
        raise UsageError(f"--num-partitions {args.num_partitions} must be within 1..world-size - 1 "
                         f"({args.world_size - 1} for --world-size {args.world_size})")
    if not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank {args.rank} must be within 0..{args.world_size - 1}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    addr, port = _env(args)
    if args.local and args.rank == 0:
        addr = "127.0.0.1"
        if args.master_port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
    builder = StageBuilder(args.model, args.num_classes, args.weights, args.models_dir, args.device)
    cuts, split_index = _cuts(args, builder)
    conditions = (get_conditions(args.network, args.network_file, **{k: getattr(args, k) for k in ADHOC})
                  if args.network or any(getattr(args, k) for k in ADHOC) else None)
    if args.rank == 0:
        return _master(args, argv, builder, cuts, split_index, conditions, addr, port)
    return _worker(args, builder, cuts, conditions, addr, port)


def _watchdog(seconds: float, what: str, procs: list[subprocess.Popen]) -> threading.Timer:
    def fire():
        print(f"error: {what} within {seconds:g}s", file=sys.stderr, flush=True)
        for p in procs:
            p.kill()
        os._exit(1)  # the RPC agent cannot be unwound from another thread; exit hard and clean
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def _worker(args, builder, cuts, conditions, addr, port) -> int:
    from ..transport import rpc as backend

    stage = args.rank - 1
    if args.rank <= args.num_partitions:
        nxt = backend.MASTER if args.rank == args.num_partitions else backend.worker_name(args.rank + 1)
        backend.setup_worker(builder, cuts, stage, nxt, conditions, last=args.rank == args.num_partitions)
    dog = _watchdog(args.timeout, f"rank {args.rank} could not join the master at {addr}:{port}", [])
    backend.init(args.rank, args.world_size, addr, port, args.rpc_transport, args.num_threads, args.timeout)
    dog.cancel()
    backend.rpc.shutdown()  # waits until the master is done with us
    return 0


def _master(args, argv, builder, cuts, split_index, conditions, addr, port) -> int:
    from ..transport import rpc as backend

    procs = _spawn_workers(args, argv, port) if args.local else []

    def check_alive() -> None:
        for rank, p in enumerate(procs, start=1):
            if p.poll() is not None:
                raise PeerError(f"worker rank {rank} (pid {p.pid}) exited with code {p.returncode}")

    dog = _watchdog(args.timeout, f"not all {args.world_size} ranks joined at {addr}:{port} "
                                  f"(start every rank with the same MASTER_ADDR/MASTER_PORT)", procs)
    transport = backend.init(0, args.world_size, addr, port, args.rpc_transport, args.num_threads, args.timeout)
    dog.cancel()
    num_batches = max(1, -(-args.num_test_samples // args.batch_size))
    cfg = RunConfig(model=builder.name, cuts=cuts, split_index=split_index, batch_size=args.batch_size,
                    num_batches=num_batches, warmup=args.warmup,
                    in_flight=args.in_flight if args.use_pipelining else 1, dataset=args.dataset,
                    data_dir=args.data_dir, num_classes=args.num_classes,
                    network=args.network_label or (conditions.name if conditions else None),
                    link_mode="emulated" if conditions else "none", timeout_s=args.timeout,
                    run_key=args.run_key, config_key=args.config_key, run=args.run,
                    rpc_transport=args.rpc_transport, use_pipelining=args.use_pipelining,
                    stage_limits={f"stage{i}": {"torch_threads": args.threads, "cpu_affinity": None}
                                  for i in range(1, args.num_partitions + 1)} if args.run_key else None)
    try:
        record, outputs = backend.run_master(cfg, args.world_size, args.num_partitions, builder.fingerprint,
                                             conditions, keep_outputs=bool(args.save_outputs), transport=transport,
                                             check_alive=check_alive if procs else None)
    except PeerError as exc:  # handshake mismatch: nothing ran
        print(f"error: {exc}", file=sys.stderr, flush=True)
        _hard_exit(procs, 1)
    path = records.atomic_write_json(Path(args.metrics_dir) / f"{record['run_id']}.json", record)
    if record["status"] != "complete":
        print(f"error: {record['error']} (incomplete record written to {path})", file=sys.stderr, flush=True)
        _hard_exit(procs, 1)
    if args.save_outputs:
        import numpy as np
        import torch

        np.savez(args.save_outputs, logits=torch.stack(outputs).numpy())
    backend.rpc.shutdown()
    for p in procs:
        p.wait(args.timeout)
    s = record["summary"]
    print(f"{builder.name} cuts={cuts} rpc latency median {s['latency_median_s'] * 1e3:.2f} ms, "
          f"throughput {s['throughput_imgs_per_s']:.1f} img/s, written {path}")
    return 0


def _hard_exit(procs: list[subprocess.Popen], code: int) -> None:
    """A dead peer leaves the RPC agent unable to shut down gracefully; stop children and exit."""
    from ..transport import rpc as backend

    for p in procs:
        p.kill()
    threading.Thread(target=lambda: backend.rpc.shutdown(graceful=False), daemon=True).start()
    sys.stderr.flush()
    os._exit(code)
