"""A long-lived stage process driven by JSON lines on stdin/stdout (locally or through SSH).

The sweeper starts one worker per stage and model, and re-partitions in place for every
configuration, so process start-up and model build are paid once per model, not per run.
Commands (one JSON object per line): ``serve`` (stage 1: listen, answer ``listening``, run),
``connect`` (stage 2: connect, run, answer with the run record), ``quit``. Nothing received is
evaluated; JSON only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Sequence

import torch

from . import cpushare
from .backends import tcp
from .backends.common import RunConfig, StageBuilder
from .errors import ParetoPipeError
from .link import Profile

log = logging.getLogger("paretopipe.worker")


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def apply_cpu_limits(cpus: str | None, threads: int | None) -> dict[str, Any]:
    """Pin to ``cpus`` (e.g. "0" or "0-1") and set torch threads; returns what was applied."""
    applied: dict[str, Any] = {}
    if cpus:
        wanted = set()
        for part in cpus.split(","):
            lo, _, hi = part.partition("-")
            wanted.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, wanted)
        applied["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    if threads:
        torch.set_num_threads(threads)
    applied["torch_threads"] = torch.get_num_threads()
    return applied


def serve_forever(role: str, builder: StageBuilder, limits: dict[str, Any]) -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            _emit({"event": "error", "error": "command is not JSON"})
            continue
        cmd = msg.get("cmd")
        if cmd == "quit":
            _emit({"event": "bye"})
            return
        try:
            cfg = RunConfig.from_dict(msg["config"])
            cfg.extra = {**cfg.extra, "stage_limits": limits}
            if role == "stage1" and cmd == "serve":
                listener = tcp.listen(msg.get("host", "127.0.0.1"), int(msg.get("port", 0)))
                try:
                    _emit({"event": "listening", "port": listener.getsockname()[1]})
                    profile = Profile.from_dict(msg["profile"]) if msg.get("profile") else None
                    outcome = tcp.run_stage1(listener, builder, cfg, profile=profile,
                                             connect_timeout=float(msg.get("connect_timeout", 60)),
                                             output_dir=None, observed_link=msg.get("observed_link"),
                                             threads=limits.get("torch_threads"))
                finally:
                    listener.close()
                _emit({"event": "done", "status": outcome.record["status"]})
            elif role == "stage2" and cmd == "connect":
                sock = tcp.connect_with_retry(msg["host"], int(msg["port"]), float(msg.get("connect_timeout", 60)))
                outcome = tcp.run_stage2(sock, builder, cfg, output_dir=None,
                                         observed_link=msg.get("observed_link"),
                                         threads=limits.get("torch_threads"))
                _emit({"event": "done", "status": outcome.record["status"], "record": outcome.record})
            else:
                _emit({"event": "error", "error": f"{role} does not understand {cmd!r}"})
        except (ParetoPipeError, OSError, KeyError, ValueError) as exc:
            _emit({"event": "error", "error": str(exc) or type(exc).__name__})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paretopipe.worker",
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
        limits = apply_cpu_limits(args.cpus, args.threads)
        builder = StageBuilder(args.model, args.num_classes, args.weights, args.models_dir, args.device)
        if args.cpu_share is not None:
            share = cpushare.limit_compute(os.getpid(), args.cpu_share, args.role)
            limits.update(share)
    except ParetoPipeError as exc:
        _emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    _emit({"event": "ready", "pid": os.getpid(), "model": builder.name, "fingerprint": builder.fingerprint,
           "num_blocks": builder.partitioner.num_blocks,
           "block_cuts": [builder.partitioner.block_cut(k) for k in range(builder.partitioner.num_blocks + 1)],
           "payload_bytes_per_image": [builder.partitioner.payload_nbytes(builder.partitioner.block_cut(k), 1)
                                       for k in range(builder.partitioner.num_blocks + 1)],
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
