"""A long-lived stage process driven by JSON lines on stdin/stdout (locally or through SSH).

The sweeper starts one worker per stage and model, and re-partitions in place for every
configuration, so process start-up and model build are paid once per model, not per run.
Commands (one JSON object per line, each checked field by field): stage 1 takes ``listen`` (open
the data port once) and ``run`` (one run over the current connection, answered with the record);
stage 2 takes ``connect`` (connect, authenticate, then serve stage 1's runs in the background);
both take ``quit``. Nothing received is evaluated; JSON only. The shared secret travels in these
commands (over the SSH channel), never on a command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from typing import Any, Sequence

from .. import cpushare
from ..errors import ParetoPipeError, UsageError
from .commands import RunCommand, emit, serve_commands

log = logging.getLogger("paretopipe.worker")


@dataclasses.dataclass
class ListenCommand:
    """Stage 1: open the data port on ``host:port`` (0 = any free port) and accept stage 2 connections."""

    cmd: str
    host: str = "127.0.0.1"
    port: int = 0
    secret: str | None = None
    encrypt: str = "none"


@dataclasses.dataclass
class Stage1RunCommand(RunCommand):
    """Stage 1: one run over the current connection (waiting up to ``connect_timeout`` for one)."""

    connect_timeout: float = 60.0


@dataclasses.dataclass
class ConnectCommand:
    """A later stage: connect to the stage before at ``host:port`` and serve its runs until it says
    goodbye; a middle stage (``next_port``) also listens for the next stage and sends its part on."""

    cmd: str
    host: str
    port: int
    secret: str | None = None
    encrypt: str = "none"
    connect_timeout: float = 60.0
    timeout: float | None = None  # None: each run's deadline, which stage 1 derives from its link
    # A middle stage of a chain: where it listens for the next stage (port 0: any free one).
    next_port: int | None = None
    next_host: str = "127.0.0.1"


COMMANDS = {"stage1": {"listen": ListenCommand, "run": Stage1RunCommand}, "stage2": {"connect": ConnectCommand}}


class StageWorker:
    """The state of one stage process between commands: its model, its listener or its connection."""

    def __init__(self, role: str, builder, limits: dict[str, Any]) -> None:
        self.role, self.builder, self.limits = role, builder, limits
        self.listener = None
        self.connection = None
        # Set while a stage-2 connection is served; cleared before "connection_ended" is emitted, so a
        # controller that connects again as soon as it reads that line is never told "already serving".
        self.serving = threading.Event()

    def handle(self, cmd: ListenCommand | Stage1RunCommand | ConnectCommand) -> None:
        """Run one checked command (see ``commands.serve_commands``)."""
        from ..network.conditions import NetworkConditions
        from ..transport import auth, tcp
        from ..transport.runconfig import RunConfig

        threads = self.limits.get("torch_threads")
        if isinstance(cmd, ListenCommand):
            if self.listener is None:
                self.listener = tcp.StageListener(tcp.listen(cmd.host, cmd.port), tcp.identity_of(self.builder),
                                                  auth.load_secret(cmd.secret or ""), encrypt=cmd.encrypt)
            emit({"event": "listening", "port": self.listener.port})
        elif isinstance(cmd, Stage1RunCommand):
            if self.listener is None:
                raise UsageError("run before listen: stage 1 has no data port yet")
            cfg = RunConfig.from_dict(cmd.config)
            self.connection = self.listener.connection(cmd.connect_timeout, self.connection)
            conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
            policy = None
            if cfg.adaptive:
                from .adaptive import adaptive_policy

                policy = adaptive_policy(self.builder, cfg)
            connection, self.connection = self.connection, None
            outcome = tcp.run_on_connection(connection, self.builder, cfg, policy=policy, listener=self.listener,
                                            conditions=conditions, observed_link=cmd.observed_link, threads=threads,
                                            limits=self.limits)
            self.connection = outcome.connection  # a stage 2 that came back during the run, or the same one
            emit({"event": "done", "status": outcome.record["status"], "record": outcome.record})
        else:
            if self.serving.is_set():
                raise UsageError("stage 2 is already serving a connection")
            secret = auth.load_secret(cmd.secret or "")
            downstream = None
            if cmd.next_port is not None:  # listening first, so the next stage may connect at once
                self.listener = tcp.StageListener(tcp.listen(cmd.next_host, cmd.next_port),
                                                  tcp.identity_of(self.builder), secret, encrypt=cmd.encrypt)
                downstream = tcp.Downstream(self.listener, cmd.connect_timeout)
                emit({"event": "listening", "port": self.listener.port})
            sock = tcp.connect_with_retry(cmd.host, cmd.port, cmd.connect_timeout)
            connection = tcp.open_connection(sock, self.builder, secret=secret, encrypt=cmd.encrypt)
            emit({"event": "connected"})

            def serve() -> None:
                error = None
                try:
                    tcp.serve_connection(connection, self.builder, threads=threads, limits=self.limits,
                                         timeout_s=cmd.timeout, downstream=downstream)
                except (ParetoPipeError, OSError) as exc:
                    error = str(exc)
                finally:
                    self.serving.clear()
                emit({"event": "connection_ended", "error": error})

            self.serving.set()
            threading.Thread(target=serve, name="stage2-serve", daemon=True).start()

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close(bye=True)
        if self.listener is not None:
            self.listener.close()


def serve_forever(worker: StageWorker) -> None:
    if serve_commands(COMMANDS[worker.role], worker.handle, worker.role):
        worker.close()
        emit({"event": "bye"})


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
        from ..partition.tables import fine_cut_table
        from ..partition.stages import StageBuilder, apply_cpu_limits

        limits = apply_cpu_limits(args.cpus, args.threads)
        builder = StageBuilder(args.model, args.num_classes, args.weights, args.models_dir, args.device)
        if args.cpu_share is not None:
            share = cpushare.limit_compute(os.getpid(), args.cpu_share, args.role)
            limits.update(share)
    except ParetoPipeError as exc:
        emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    part = builder.partitioner
    cuts = part.block_cuts()
    emit({"event": "ready", "pid": os.getpid(), "model": builder.name, "fingerprint": builder.fingerprint,
           "num_blocks": part.num_blocks, "block_cuts": cuts,
           "payload_bytes_per_image": [part.payload_nbytes(c, 1) for c in cuts], "fine_cuts": fine_cut_table(part),
           "limits": limits})
    worker = StageWorker(args.role, builder, limits)
    try:
        serve_forever(worker)
    except KeyboardInterrupt:
        return 130
    finally:
        worker.close()
        if share is not None:
            cpushare.release(share, os.getpid())
    return 0


def exit_now(code: int) -> None:
    """Exit once our own cleanup is done, skipping the interpreter's teardown of torch (about 1 s
    per process): a sweep stops its processes after every model and backend."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
