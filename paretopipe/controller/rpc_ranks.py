"""RPC ranks as processes: each joins one RPC group and stays for a whole sweep (or one run).

``python -m paretopipe.controller.rpc_ranks --rank R ...`` is what the sweeper starts, here or over
SSH, one process per rank. Rank 0 (the master) answers JSON lines on stdin/stdout like a TCP stage
worker: ``run`` (configure the ranks for one configuration, run it, answer with the record) and
``quit``. Ranks 1..N-1 build their model, join, and serve until the master shuts the group down.
``distributed_runner.py`` uses the same code for one run (``--local`` spawns the ranks here).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Sequence

from ..compute import cpushare
from . import zygote
from ..errors import ParetoPipeError, PeerError
from ..options import flags
from .commands import RunCommand, emit, serve_commands
from .worker import exit_now, model_report
from ..options.flags import ModelProcess
from ..network import deadlines
from ..network.conditions import NetworkConditions
from ..transport.runconfig import RunConfig

log = logging.getLogger("paretopipe.rpc")


@dataclasses.dataclass(kw_only=True)
class RankOptions(ModelProcess):
    """One rank's command line (``python -m paretopipe.controller.rpc_ranks`` + :meth:`to_argv`): the
    one declaration that ``distributed_runner.py --local`` and the sweeper write and the rank parses."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    transport: str = flags.option(flags.RPC_TRANSPORT)
    rpc_threads: int = 16
    #: Seconds for every rank to start, build its model and join: start-up, not the link, so not --timeout.
    join_timeout: float = 60.0
    source: str = flags.option(flags.RPC_SOURCE)
    #: The master builds every other rank's stage there: the device of each rank's, comma-separated
    #: (``cpu,cpu,cuda``; unset: the master's own device for every rank).
    rank_devices: str | None = None
    #: A slower device emulated here: this rank held to a share of one core. The whole process, not
    #: only its compute threads as a TCP worker's: a rank computes in the RPC library's own threads.
    cpu_share: float | None = flags.option(flags.CPU_SHARE)

    def spec_of(self, rank: int) -> Any:
        """What rank ``rank`` builds when the master asks it to: this model, on that rank's device."""
        # lazy for start-up: torch
        from ..transport.rpc import StageSpec

        devices = self.rank_devices.split(",") if self.rank_devices else []
        return StageSpec(model=self.model, model_dir=self.model_dir, num_classes=self.num_classes,
                         weights=self.weights, models_dir=self.models_dir,
                         device=devices[rank] if rank < len(devices) else self.device)


def watchdog(seconds: float, what: str, procs: Sequence[subprocess.Popen] = ()) -> threading.Timer:
    """Exit hard with one line if ``what`` has not happened within ``seconds``: a rank that cannot
    join blocks inside the RPC agent, which cannot be unwound from another thread."""
    def fire():
        print(f"error: {what} within {seconds:g}s", file=sys.stderr, flush=True)
        for p in procs:
            p.kill()
        os._exit(1)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def hard_exit(procs: Sequence[subprocess.Popen], code: int) -> None:
    """A dead peer leaves the RPC agent unable to shut down gracefully; stop children and exit."""
    # lazy for start-up: torch
    from ..transport import rpc as backend

    for p in procs:
        p.kill()
    threading.Thread(target=lambda: backend.rpc.shutdown(graceful=False), daemon=True).start()
    sys.stderr.flush()
    os._exit(code)


def _die_with_parent() -> None:
    # Local ranks must never outlive the rank that spawned them: the kernel kills them when it exits.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn_local(opts: RankOptions) -> list[Any]:
    """Ranks 1..world-1 on this machine (for ``--local``); they die with this one.

    Each is forked from this process once the code a rank runs is imported, as the sweep's zygote
    forks its stages: a fresh interpreter would import torch again, 2 to 3 s of CPU per rank. The
    master calls this before it builds anything, so no compute thread of torch's exists yet to be
    lost in the fork. ``PARETOPIPE_NO_ZYGOTE=1`` starts them as plain processes instead."""
    argvs = [dataclasses.replace(opts, rank=rank).to_argv() for rank in range(1, opts.world_size)]
    if not zygote.enabled():
        return [subprocess.Popen([sys.executable, "-m", __name__, *argv], preexec_fn=_die_with_parent,
                                 stdout=subprocess.DEVNULL) for argv in argvs]
    # What each rank imports on its way to joining (torch, the RPC backend, the stage code): here, once
    # for every fork, rather than once in each rank (deferred until now for --help's start-up).
    importlib.import_module("paretopipe.transport.rpc")
    return [ForkedRank(argv) for argv in argvs]


class ForkedRank:
    """A rank forked from this process: the part of ``subprocess.Popen`` the master uses."""

    def __init__(self, argv: list[str]) -> None:
        self._process = multiprocessing.get_context("fork").Process(target=_be_rank, args=(argv,), daemon=True)
        self._process.start()
        self.pid = self._process.pid
        self.args = [sys.executable, "-m", __name__, *argv]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()


def _be_rank(argv: list[str]) -> None:
    """In the forked child: what ``python -m paretopipe.controller.rpc_ranks argv`` would be, with the
    stdout, signals and logging of a fresh rank rather than the master's."""
    _die_with_parent()
    zygote.set_title(" ".join([sys.executable, "-m", __name__, *argv]))
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True)
    logging.getLogger("paretopipe").setLevel(logging.NOTSET)
    exit_now(main(argv))


def serve_rank(opts: RankOptions, one_run: Callable[[Any, Any, dict], int] | None = None,
               procs: Sequence[subprocess.Popen] = (), share: dict[str, Any] | None = None) -> int:
    """Be rank ``opts.rank``. Every rank but the master joins and serves what the master builds on
    it until the master shuts the group down. The master builds its own model, builds every other
    rank's stage there and checks them, then takes ``run`` commands on stdin until ``quit``, or
    calls ``one_run(builder, group, transport)`` once (the command-line face) and returns its status."""
    import warnings

    # lazy for start-up: torch
    from ..partition.stages import apply_cpu_limits
    # lazy for start-up: torch
    from ..transport import rpc as backend

    # torch's own deprecation notice from inside rpc.shutdown, on every rank: not ours to act on.
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    limits = {**apply_cpu_limits(opts.cpus, opts.threads), **(share if share and share.get("cpu_share") else {})}
    builder = _master_model(opts) if opts.rank == 0 else None
    if one_run is None:
        emit({"event": "ready", "pid": os.getpid(), "rank": opts.rank, "limits": limits,
              **(model_report(builder) if builder is not None else {})})
    transport = _join(opts, procs)
    if opts.rank != 0:
        backend.rpc.shutdown()  # serves the master's calls until it shuts the group down
        return 0
    group = backend.RankGroup({r: opts.spec_of(r) for r in range(1, opts.world_size)},
                              max(opts.join_timeout, deadlines.BASE_S))
    group.check(builder)
    if one_run is not None:
        return one_run(builder, group, transport)
    emit({"event": "joined"})

    def run(cmd: RunCommand) -> None:
        record = run_config(builder, group, transport, cmd, limits)
        emit({"event": "done", "status": record["status"], "record": record})
        if record["status"] != "complete":
            hard_exit([], 1)  # a rank is gone or stuck: the group cannot be reused

    serve_commands({"run": RunCommand}, run, "rank 0")
    emit({"event": "bye"})
    backend.rpc.shutdown()
    return 0


def _master_model(opts: RankOptions) -> Any:
    """The master's own model (its cuts and, with the data at stage 1, its stage)."""
    # lazy for start-up: torch, transformers
    from ..transport.stagemodel import stage_builder

    return stage_builder(opts.model, num_classes=opts.num_classes, weights=opts.weights, models_dir=opts.models_dir,
                         device=opts.device, model_dir=opts.model_dir)


def _join(opts: RankOptions, procs: Sequence[subprocess.Popen]) -> dict[str, Any]:
    """Join the group within the join timeout (a rank that cannot join blocks inside the agent)."""
    # lazy for start-up: torch
    from ..transport import rpc as backend

    what = (f"rank {opts.rank} could not join the master at {opts.master_addr}:{opts.master_port}" if opts.rank else
            f"not all {opts.world_size} ranks joined at {opts.master_addr}:{opts.master_port} (start every rank "
            f"with the same MASTER_ADDR/MASTER_PORT)")
    dog = watchdog(opts.join_timeout, what, procs)
    transport = backend.init(opts.rank, opts.world_size, opts.master_addr, opts.master_port, opts.transport,
                             opts.rpc_threads, opts.join_timeout)
    dog.cancel()
    return transport


def run_config(builder: Any, group: Any, transport: dict, cmd: RunCommand, limits: dict[str, Any]) -> dict[str, Any]:
    # lazy for start-up: torch
    from ..transport import rpc as backend
    cfg = RunConfig.from_dict(cmd.config)
    conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
    source = cfg.rpc.source if cfg.rpc else "master"
    record, _ = backend.run_master(cfg, builder, group, source=source, conditions=conditions, transport=transport,
                                   limits=limits, observed_link=cmd.observed_link)
    return record


def check_alive_of(procs: Sequence[subprocess.Popen]) -> Callable[[], None]:
    def check() -> None:
        for rank, proc in enumerate(procs, start=1):
            if proc.poll() is not None:
                raise PeerError(f"worker rank {rank} (pid {proc.pid}) exited with code {proc.returncode}")
    return check


def main(argv: Sequence[str] | None = None) -> int:
    opts = RankOptions.parse(argv, "python -m paretopipe.controller.rpc_ranks",
                             "One RPC rank for the sweeper (rank 0 takes JSON lines on stdin).")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        with cpushare.limited(opts.cpu_share, f"rank{opts.rank}") as share:
            return serve_rank(opts, share=share)
    except ParetoPipeError as exc:
        emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    exit_now(main())  # after rpc.shutdown: nothing of ours is left to clean up

