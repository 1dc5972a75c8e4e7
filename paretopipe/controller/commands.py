"""The command protocol between the sweeper and its stage processes (TCP stage workers and RPC rank
0): one JSON object per line on stdin, one event per line on stdout.

The commands are declared once, here, as dataclasses: the sweeper writes them (:func:`encode`) and
the processes read them back with the same types. Nothing received is evaluated: a line is JSON or refused, a command is one of the process's known
names or refused, and its fields are checked one by one into a dataclass (``strict``). A refused
or failed command becomes an ``error`` event and the process stays up for the next one.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from typing import Any, Callable, Iterable, Mapping

from .. import strict
from ..errors import ParetoPipeError, UsageError

_EMIT_LOCK = threading.Lock()


@dataclasses.dataclass(kw_only=True)
class RunCommand:
    """One run of ``config`` (a RunConfig) under ``conditions`` (emulated) or ``observed_link``
    (tc): what TCP stage 1 and RPC rank 0 are both asked to do."""

    cmd: str = "run"
    config: dict[str, Any]
    conditions: dict[str, Any] | None = None
    observed_link: dict[str, Any] | None = None


@dataclasses.dataclass(kw_only=True)
class ListenCommand:
    """Stage 1: open the data port on ``host:port`` (0 = any free port) and accept stage 2 connections."""

    cmd: str = "listen"
    host: str = "127.0.0.1"
    port: int = 0
    secret: str | None = None
    encrypt: str = "none"
    transport: str = "tcp"
    mqtt: dict[str, Any] | None = None  # MqttSettings fields, its password included (like the secret)


@dataclasses.dataclass(kw_only=True)
class Stage1RunCommand(RunCommand):
    """Stage 1: one run over the current connection (waiting up to ``connect_timeout`` for one),
    replaying ``cpu_traces`` (``cputrace.StageTrace`` fields: stage, cgroup, trace, offset_s) on
    the stages' groups; a fault on stage 2 is asked of the sweep mid-run (``controller.faultinject``)."""

    connect_timeout: float = 60.0
    cpu_traces: list[dict[str, Any]] | None = None


@dataclasses.dataclass(kw_only=True)
class ConnectCommand:
    """A later stage: connect to the stage before at ``host:port`` and serve its runs until it says
    goodbye; a middle stage (``next_port``) also listens for the next stage and sends its part on."""

    cmd: str = "connect"
    host: str
    port: int
    secret: str | None = None
    encrypt: str = "none"
    transport: str = "tcp"
    mqtt: dict[str, Any] | None = None
    connect_timeout: float = 60.0
    timeout: float | None = None  # None: each run's deadline, which stage 1 derives from its link
    # A middle stage of a chain: where it listens for the next stage (port 0: any free one).
    next_port: int | None = None
    next_host: str = "127.0.0.1"


#: What the sweeper sends: any command above, written as the receiver reads it (:func:`encode`).
Command = RunCommand | ListenCommand | ConnectCommand


def encode(command: Command) -> dict[str, Any]:
    """A command as its JSON line's object: the dataclass the receiving process checks it into."""
    return dataclasses.asdict(command)


def emit(event: dict[str, Any]) -> None:
    """One event line; threads of one process never interleave theirs."""
    with _EMIT_LOCK:
        sys.stdout.write(json.dumps(event, default=str) + "\n")
        sys.stdout.flush()


def serve_commands(commands: Mapping[str, type], handle: Callable[[Any], None], who: str,
                   lines: Iterable[str] | None = None) -> bool:
    """Hand each valid command on ``lines`` (stdin) to ``handle`` as its dataclass, in order.
    Returns True on ``quit``, False when the input ends."""
    for line in sys.stdin if lines is None else lines:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            emit({"event": "error", "error": "command is not JSON"})
            continue
        if isinstance(msg, dict) and msg.get("cmd") == "quit":
            return True
        try:
            if not isinstance(msg, dict):
                raise UsageError("a command must be a JSON object")
            name = msg.get("cmd")
            if name not in commands:
                raise UsageError(f"{who} does not understand {str(name)[:40]!r} "
                                 f"(it takes {', '.join(commands)} and quit)")
            handle(strict.from_dict(commands[name], msg, f"{name} command"))
        except (ParetoPipeError, OSError) as exc:
            emit({"event": "error", "error": str(exc) or type(exc).__name__})
    return False
