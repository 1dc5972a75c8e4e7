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

import dataclasses
import logging
import os
import sys
import threading
from typing import Any, Sequence

from .. import strict
from ..compute import cpushare, cputrace
from ..errors import ParetoPipeError, UsageError
from ..options import flags
from .commands import ConnectCommand, ListenCommand, Stage1RunCommand, emit, serve_commands
from .faultinject import ask_the_sweep
from ..options.flags import ModelProcess
from ..network.conditions import NetworkConditions
from ..transport import messaging
from ..transport.runconfig import DEFAULT_MAX_PAYLOAD, RunConfig

log = logging.getLogger("paretopipe.worker")


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
        # lazy for start-up: torch
        from ..transport import auth, tcp
        threads = self.limits.get("torch_threads")
        if isinstance(cmd, ListenCommand):
            if self.listener is None:
                self.listener = tcp.StageListener(
                    messaging.listen(_transport(cmd), cmd.host, cmd.port, DEFAULT_MAX_PAYLOAD),
                    tcp.identity_of(self.builder), auth.load_secret(cmd.secret or ""), encrypt=cmd.encrypt)
            emit({"event": "listening", "port": self.listener.port})
        elif isinstance(cmd, Stage1RunCommand):
            if self.listener is None:
                raise UsageError("run before listen: stage 1 has no data port yet")
            self._run(cmd, threads)
        else:
            if self.serving.is_set():
                raise UsageError("stage 2 is already serving a connection")
            secret = auth.load_secret(cmd.secret or "")
            downstream = None
            if cmd.next_port is not None:  # listening first, so the next stage may connect at once
                self.listener = tcp.StageListener(
                    messaging.listen(_transport(cmd), cmd.next_host, cmd.next_port, DEFAULT_MAX_PAYLOAD),
                    tcp.identity_of(self.builder), secret, encrypt=cmd.encrypt)
                downstream = tcp.Downstream(self.listener, cmd.connect_timeout)
                emit({"event": "listening", "port": self.listener.port})
            sock = messaging.connect(_transport(cmd), cmd.host, cmd.port, cmd.connect_timeout, DEFAULT_MAX_PAYLOAD)
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

    def _run(self, cmd: Stage1RunCommand, threads: int | None) -> None:
        """Stage 1's run over its current connection, answered with the record."""
        # lazy for start-up: torch
        from ..transport import tcp
        cfg = RunConfig.from_dict(cmd.config)
        self.connection = self.listener.connection(cmd.connect_timeout, self.connection)
        conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
        policy = None
        if cfg.adaptive:
            # lazy for start-up: torch
            from .adaptive_setup import adaptive_policy

            policy = adaptive_policy(self.builder, cfg)
        traced = [cputrace.StageTrace.of(t) for t in cmd.cpu_traces or ()]
        # The sweep applies stage 2's fault, and the link's where tc shapes it (no emulated link here).
        on_fault = ask_the_sweep if cfg.fault is not None and (cfg.fault.target == "stage2" or conditions is None) \
            else None
        connection, self.connection = self.connection, None
        outcome = tcp.run_on_connection(connection, self.builder, cfg, policy=policy, listener=self.listener,
                                        conditions=conditions, observed_link=cmd.observed_link, threads=threads,
                                        limits=self.limits, cpu_traces=traced, on_fault=on_fault)
        self.connection = outcome.connection  # a stage 2 that came back during the run, or the same one
        emit({"event": "done", "status": outcome.record["status"], "record": outcome.record})

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close(bye=True)
        if self.listener is not None:
            self.listener.close()


def _transport(cmd: ListenCommand | ConnectCommand) -> messaging.TransportSpec:
    """The data port's transport a command names (MQTT: with the broker settings it carries)."""
    mqtt = strict.from_dict(messaging.MqttSettings, cmd.mqtt, "mqtt") if cmd.mqtt else None
    return messaging.TransportSpec(cmd.transport, mqtt)


ROLE = flags.Option(("--role",), "stage1 listens and runs; stage2 connects and serves", choices=("stage1", "stage2"))


@dataclasses.dataclass(kw_only=True)
class WorkerOptions(ModelProcess):
    """A stage worker's command line (``python -m paretopipe.controller.worker`` + :meth:`to_argv`):
    the one declaration the sweeper writes and the worker parses. The secret is never here."""

    role: str = flags.option(ROLE, required=True)
    cpu_share: float | None = flags.option(flags.CPU_SHARE)


def model_report(builder: Any) -> dict[str, Any]:
    """What a stage process reports of the model it built (a group's :class:`GroupInfo`): its name
    and weights, its cuts and the bytes per image (a language model: per token) that cross each, its
    fine cuts (an image model's)."""
    # lazy for start-up: torch
    from ..partition.tables import fine_cut_table

    part = builder.partitioner
    cuts = part.block_cuts()
    return {"model": builder.name, "fingerprint": builder.fingerprint, "num_blocks": part.num_blocks,
            "block_cuts": cuts, "payload_bytes_per_image": [part.payload_nbytes(c, 1) for c in cuts],
            "fine_cuts": fine_cut_table(part)}


def serve_forever(worker: StageWorker) -> None:
    if serve_commands(COMMANDS[worker.role], worker.handle, worker.role):
        worker.close()
        emit({"event": "bye"})


def main(argv: Sequence[str] | None = None) -> int:
    args = WorkerOptions.parse(argv, "python -m paretopipe.controller.worker",
                               "Stage worker for the sweeper (JSON lines on stdin/stdout).")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    share = None
    try:
        # lazy for start-up: torch
        from ..partition.stages import apply_cpu_limits
        # lazy for start-up: torch, transformers
        from ..transport.stagemodel import stage_builder

        limits = apply_cpu_limits(args.cpus, args.threads)
        builder = stage_builder(args.model, num_classes=args.num_classes, weights=args.weights,
                                models_dir=args.models_dir, device=args.device, model_dir=args.model_dir)
        if args.cpu_share is not None:
            share = cpushare.limit_compute(os.getpid(), args.cpu_share, args.role)
            limits.update(share)
    except ParetoPipeError as exc:
        emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    emit({"event": "ready", "pid": os.getpid(), **model_report(builder), "limits": limits})
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
