"""A long-lived stage process driven by JSON lines on stdin/stdout (locally or through SSH).

The sweeper starts one worker per stage and model, and re-partitions in place for every
configuration, so process start-up and model build are paid once per model, not per run.
Commands (one JSON object per line, each checked field by field): ``serve`` (stage 1: listen,
answer ``listening``, run), ``connect`` (stage 2: connect, run, answer with the run record),
``quit``. Nothing received is evaluated; JSON only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any, Sequence

from .. import cpushare, strict
from ..errors import ParetoPipeError, UsageError

log = logging.getLogger("paretopipe.worker")


@dataclasses.dataclass
class ServeCommand:
    """Stage 1: listen on ``host:port`` (0 = any free port) and serve one run."""

    cmd: str
    config: dict[str, Any]
    host: str = "127.0.0.1"
    port: int = 0
    conditions: dict[str, Any] | None = None
    observed_link: dict[str, Any] | None = None
    connect_timeout: float = 60.0


@dataclasses.dataclass
class ConnectCommand:
    """Stage 2: connect to stage 1 at ``host:port`` and run."""

    cmd: str
    config: dict[str, Any]
    host: str
    port: int
    observed_link: dict[str, Any] | None = None
    connect_timeout: float = 60.0


COMMANDS = {"serve": ServeCommand, "connect": ConnectCommand}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def handle(role: str, msg: dict[str, Any], builder, limits: dict[str, Any]) -> None:
    """Run one command; errors become an ``error`` event (the worker itself stays up)."""
    from ..network.conditions import NetworkConditions
    from ..transport import tcp
    from ..transport.runconfig import RunConfig

    name = msg.get("cmd")
    wanted = {"stage1": "serve", "stage2": "connect"}[role]
    if name != wanted:
        raise UsageError(f"{role} does not understand {str(name)[:40]!r} (it takes {wanted!r} and 'quit')")
    cmd = strict.from_dict(COMMANDS[name], msg, f"{name} command")
    cfg = RunConfig.from_dict(cmd.config)
    threads = limits.get("torch_threads")
    if isinstance(cmd, ServeCommand):
        listener = tcp.listen(cmd.host, cmd.port)
        try:
            _emit({"event": "listening", "port": listener.getsockname()[1]})
            conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
            outcome = tcp.run_stage1(listener, builder, cfg, conditions=conditions,
                                     connect_timeout=cmd.connect_timeout, output_dir=None,
                                     observed_link=cmd.observed_link, threads=threads, limits=limits)
        finally:
            listener.close()
        _emit({"event": "done", "status": outcome.record["status"]})
    else:
        sock = tcp.connect_with_retry(cmd.host, cmd.port, cmd.connect_timeout)
        outcome = tcp.run_stage2(sock, builder, cfg, output_dir=None, observed_link=cmd.observed_link,
                                 threads=threads, limits=limits)
        _emit({"event": "done", "status": outcome.record["status"], "record": outcome.record})


def serve_forever(role: str, builder, limits: dict[str, Any]) -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError):
            _emit({"event": "error", "error": "command is not JSON"})
            continue
        if isinstance(msg, dict) and msg.get("cmd") == "quit":
            _emit({"event": "bye"})
            return
        try:
            if not isinstance(msg, dict):
                raise UsageError("a command must be a JSON object")
            handle(role, msg, builder, limits)
        except (ParetoPipeError, OSError) as exc:
            _emit({"event": "error", "error": str(exc) or type(exc).__name__})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paretopipe.runners.worker",
                                description="Stage worker for the sweeper (JSON lines on stdin/stdout).")
    p.add_argument("--role", choices=["stage1", "stage2"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--weights", default=None)
    p.add_argument("--models-dir", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cpus", default=None, help="CPU list to pin to, e.g. 0 or 0-1")
    p.add_argument("--cpu-share", type=float, default=None,
                   help="CPU share of the compute threads via a cgroup quota (1 = one core), after the model is built")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    share = None
    try:
        from ..partition.stages import StageBuilder, apply_cpu_limits

        limits = apply_cpu_limits(args.cpus, args.threads)
        builder = StageBuilder(args.model, args.num_classes, args.weights, args.models_dir, args.device)
        if args.cpu_share is not None:
            share = cpushare.limit_compute(os.getpid(), args.cpu_share, args.role)
            limits.update(share)
    except ParetoPipeError as exc:
        _emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    part = builder.partitioner
    _emit({"event": "ready", "pid": os.getpid(), "model": builder.name, "fingerprint": builder.fingerprint,
           "num_blocks": part.num_blocks, "block_cuts": [part.block_cut(k) for k in range(part.num_blocks + 1)],
           "payload_bytes_per_image": [part.payload_nbytes(part.block_cut(k), 1) for k in range(part.num_blocks + 1)],
           "limits": limits})
    try:
        serve_forever(args.role, builder, limits)
    except KeyboardInterrupt:
        return 130
    finally:
        if share is not None:
            cpushare.release(share, os.getpid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
