"""The sweeper: model x split x network x backend x run, resumable, with consolidated outputs.

Stage processes start once per model and backend (locally, each pinned to its own cores, or on
the testbed's hosts over SSH) and re-partition in place for every configuration. With ``--link
tc`` each host shapes its own egress (stage 1's host the up direction, the last stage's host the
down direction), only for the sweep's traffic. A configuration that fails is recorded, retried
once on fresh processes, and the sweep goes on; the exit status then says how many failed. Every
file is written atomically, so killing the sweep loses at most the configuration in flight, and
``--resume`` finishes what is missing. A full disk stops the sweep at once, never retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from .. import cpushare, records, strict
from ..analysis.session import Session, cipher_of, config_key, run_key, sessions_under
from ..errors import ParetoPipeError, PeerError, UsageError
from ..manifest import node_manifest
from ..network import deadlines, tc, tracecontrol
from ..network.conditions import NetworkConditions, conditions_from_values, get_conditions
from ..splits import check_splits
from ..splits import Split, is_cut_name
from ..transport.runconfig import ADAPTIVE, AdaptiveOptions, RpcOptions, RunConfig
from . import rounds, zygote
from .hosts import Host, Testbed
from .processes import Placement, RpcRanks, TcpStages

log = logging.getLogger("paretopipe.sweep")
BACKENDS = ("tcp", "rpc")
#: runs.csv and session.json are rebuilt at most this often during a sweep (and at its end); the
#: run records, written after every run, are the source of truth either way.
CONSOLIDATE_EVERY_S = 5.0
LINKS = ("emulated", "tc", "none")
INFEASIBLE = "infeasible"


class DiskFullError(ParetoPipeError):
    """No room left to write results: the sweep stops, nothing is retried."""


def split_adaptive(text: str) -> tuple[str, bool]:
    """``--splits`` without its ``adaptive`` member, and whether it had one."""
    parts = [p.strip() for p in text.split(",")]
    kept = [p for p in parts if p.lower() != ADAPTIVE]
    return ",".join(kept), len(kept) != len(parts)


def split_cuts(text: str) -> tuple[str, list[str]]:
    """``--splits`` without the fine cuts it names, and those names in order."""
    parts = [p.strip() for p in text.split(",")]
    named = [p for p in parts if p.lower() != "all" and is_cut_name(p)]
    return ",".join(p for p in parts if p not in named), named  # an empty member stays, for parse_splits to refuse


def parse_splits(text: str, num_blocks: int) -> list[int]:
    """``all``, ``1,4,8``, ``2-10`` or a mix, each within 0..K (0 and K are the baselines)."""
    if text.strip().lower() == "all":
        return list(range(num_blocks + 1))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise UsageError(f"bad --splits range {part!r}: write it low-high, e.g. 2-10")
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"bad --splits {text!r}: use all, a list like 1,4,8 or a range like 2-10")
    check_splits(out, num_blocks)
    if not out:
        raise UsageError(f"--splits {text!r} names no split: use all, a list like 1,4,8 or a range like 2-10")
    return sorted(set(out))


def parse_plans(text: str) -> list[tuple[int, ...]]:
    """``3,9;5,12``: N-stage plans as ``--split-blocks`` lists (the planner prints them so)."""
    plans = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            ks = tuple(int(k) for k in part.split(","))
        except ValueError:
            raise UsageError(f"bad --split-blocks {text!r}: plans are comma lists of block indices separated by "
                             f"';', e.g. 3,9;5,12")
        if list(ks) != sorted(ks) or min(ks) < 0:
            raise UsageError(f"--split-blocks plan {part!r}: block indices must be increasing and at least 0")
        plans.append(ks)
    if not plans:
        raise UsageError(f"--split-blocks {text!r} names no plan")
    if len({len(p) for p in plans}) != 1:
        raise UsageError(f"--split-blocks {text!r}: every plan needs the same number of stages")
    return plans


def session_dir(out_dir: str, session: str | None, resume: bool) -> Path:
    """The session folder: ``--session`` under ``--out``, the newest one for ``--resume``, or a new
    timestamped one."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the sessions")
    if session:
        if "/" in session or session in (".", ".."):
            raise UsageError(f"--session {session!r}: a folder name, not a path")
        return out / session
    if resume:
        sessions = sessions_under(out, "session.json")
        if not sessions:
            raise UsageError(f"--resume: no session found under {out}; give the --out of an earlier sweep")
        return sessions[-1]
    return out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: a configuration (model, backend, network, split) and its repetition."""

    model: str
    backend: str
    network: str
    split: Split
    run: int
    reference: bool = False  # a drift check's re-measurement of the reference configuration
    cipher: str = "none"     # the TCP data port's --encrypt choice (transport.aead)

    @property
    def split_index(self) -> int | str:
        return self.split.label

    @property
    def stages(self) -> int:
        return self.split.stages

    @property
    def config_key(self) -> str:
        return config_key(self.model, self.backend, self.network, self.split, self.cipher)

    @property
    def run_key(self) -> str:
        return f"{self.config_key}_ref{self.run}" if self.reference else run_key(self.config_key, self.run)


@dataclasses.dataclass
class SweepOptions:
    models: list[str]
    splits: str = "all"
    max_live: int = 1
    plans: list[tuple[int, ...]] | None = None
    runs: int = 3
    networks: list[str] = dataclasses.field(default_factory=lambda: ["lan"])
    backends: list[str] = dataclasses.field(default_factory=lambda: ["tcp"])
    batch_size: int = 8
    num_batches: int = 20
    warmup: int = 3
    warmup_every_run: bool = False
    in_flight: int = 1
    link: str = "emulated"
    out: str = "results"
    session: str | None = None
    resume: bool = False
    wait_time: float = 120.0
    timeout: float | None = None        # None: each run's deadline follows its link (network.deadlines)
    max_batch_s: float | None = None    # a batch slower than this makes its configuration infeasible
    prefetch_batches: int = 0           # input batches prepared ahead in a thread (--enable-prefetch)
    threads: int | None = None
    optimizations: bool = True
    dry_run: bool = False
    cleanup: bool = False
    report: bool = True
    testbed: Testbed = dataclasses.field(default_factory=Testbed)
    network_file: str | None = None
    wire_dtype: str = "float32"
    compression: str = "none"
    # The TCP data port's --encrypt choices (transport.aead): one worker group each, since a cipher is
    # agreed per connection; the cipher is part of a configuration's key.
    ciphers: list[str] = dataclasses.field(default_factory=lambda: ["none"])
    stage_cpu: list[float | None] = dataclasses.field(default_factory=lambda: [None, None])
    stage_threads: list[int | None] = dataclasses.field(default_factory=lambda: [None, None])
    stage_devices: list[str] = dataclasses.field(default_factory=list)
    rpc_source: str = "master"
    rpc_transport: str = "uv"
    num_classes: int = 10
    weights: str | None = None
    dataset: str = "synthetic"
    data_dir: str | None = None
    inline_networks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    order: str = "random"
    seed: int = 0
    precision: float | None = None      # relative half-width of the 95% CIs, e.g. 0.05
    max_runs: int | None = None         # per-configuration budget of runs with a precision target
    drift_every_s: float = 60.0         # re-measure the reference this often (0: never)
    objective: str = "latency"          # the adaptive split's objective
    objectives: str | None = None       # the fronts' objectives (report, closing table): latency,throughput
    energy_rate_hz: float = 10.0        # how often each stage reads its power sensors
    # Per stage: declared idle watts and the watts one busy core adds (modelled energy where a host
    # has no sensor), and memory limits in bytes; None entries take the host's (.env / [hosts]).
    power_idle_w: list[float | None] = dataclasses.field(default_factory=list)
    power_core_w: list[float | None] = dataclasses.field(default_factory=list)
    memory_limits: list[int | None] = dataclasses.field(default_factory=list)
    deadline_s: float | None = None     # a TCP run's deadline before a batch is finished locally (static or adaptive)


@dataclasses.dataclass
class SweepResult:
    path: Path
    configurations: int
    failed: list[PlannedRun]
    measured: int = 0  # runs recorded (complete or infeasible), resumed ones included


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What a started stage group reports of the model its stages built (every stage built the
    same: the group checked their fingerprints), checked field by field: it comes from worker
    processes, over SSH on a testbed."""

    model: str
    fingerprint: str
    num_blocks: int
    block_cuts: list[str]
    payload_bytes_per_image: list[int] = dataclasses.field(default_factory=list)
    # every fine cut in graph order: name -> [tensors that cross it, bytes per image]
    fine_cuts: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    limits: dict[str, Any] | None = None  # per stage: its CPU and memory limits as applied
    world_size: int | None = None  # the rpc backend's ranks
    stage_ranks: list[int] | None = None
    devices: list[str] | None = None

    @classmethod
    def of(cls, reported: dict[str, Any]) -> "GroupInfo":
        """The fields of a group's report (a worker's ready event carries more, such as its pid)."""
        names = {f.name for f in dataclasses.fields(cls)}
        info = strict.from_dict(cls, {k: v for k, v in reported.items() if k in names}, "the stage group's report")
        if len(info.block_cuts) != info.num_blocks + 1:
            raise PeerError(f"the stage group reported {len(info.block_cuts)} block cuts for {info.num_blocks} blocks")
        for name, value in info.fine_cuts.items():
            if not (is_cut_name(name) and isinstance(value, list) and len(value) == 2
                    and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= strict.MAX_INT for v in value)):
                raise PeerError(f"the stage group reported fine cut {str(name)[:60]!r} as {str(value)[:60]}, "
                                f"not [tensors, bytes per image]")
        return info


class StageGroup(Protocol):
    """What the sweep asks of the processes that run its stages (:class:`TcpStages`,
    :class:`RpcRanks`, or a test's scripted group): start and report the model's ``info`` (read
    as a :class:`GroupInfo`), run one configuration and return its record, say whether they are
    alive, stop."""

    def start(self) -> dict[str, Any]: ...

    def run(self, cfg: dict[str, Any], conditions: dict | None, observed: dict | None,
            budget: float) -> dict[str, Any]: ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


#: Makes the stage group of one (model, backend) under the sweeper's current cipher; the default
#: starts real processes.
GroupFactory = Callable[["Sweeper", str, str], StageGroup]


@dataclasses.dataclass
class _GroupState:
    """One model and backend's configurations while they are measured: each one's progress, the
    drift monitor and its reference, the runs drift set aside to measure again, and the session's
    record of the group (``meta``)."""

    name: str
    cipher: str | None
    configs: list[tuple]
    progress: dict[tuple, Any]
    max_runs: int
    drift: Any
    reference: tuple
    meta: dict[str, Any]
    rerun: dict[tuple, list[int]]
    rerun_done: set[str] = dataclasses.field(default_factory=set)


def _check_options(opts: SweepOptions) -> None:
    """Refuse, before anything starts, the option combinations a sweep cannot run, by name."""
    tb = opts.testbed
    unknown = [b for b in opts.backends if b not in BACKENDS]
    if unknown:
        raise UsageError(f"unknown backend {unknown[0]!r}; valid: tcp, rpc, both")
    if opts.order not in rounds.ORDERS:
        raise UsageError(f"--order {opts.order!r}: valid {', '.join(rounds.ORDERS)}")
    if opts.precision is not None and not 0 < opts.precision < 1:
        raise UsageError(f"--precision {opts.precision:.0%}: give a target between 0% and 100%, e.g. 5%")
    if opts.max_runs is not None and opts.max_runs < opts.runs:
        raise UsageError(f"--max-runs {opts.max_runs} is below --runs {opts.runs}: the budget must allow the "
                         f"minimum")
    if opts.link not in LINKS:
        raise UsageError(f"--link {opts.link!r}: valid {', '.join(LINKS)}")
    if split_adaptive(opts.splits)[1]:
        if opts.plans or "rpc" in opts.backends:
            raise UsageError("the adaptive split runs on the TCP backend with two stages: use --backend tcp "
                             "and --splits ...,adaptive")
        if opts.in_flight != 1:
            raise UsageError(f"--in-flight {opts.in_flight}: the adaptive runtime keeps one batch in flight; "
                             f"use --in-flight 1 (and compare it with static splits measured so)")
    if opts.deadline_s is not None and ("rpc" in opts.backends or opts.in_flight != 1):
        raise UsageError("--deadline-ms settles each TCP batch before the next: use --backend tcp and --in-flight 1")
    if opts.plans and "tcp" in opts.backends and opts.link == "tc" and not tb.remote:
        # On one machine every TCP stage listens on 127.0.0.1, and tc shapes by the data port: a
        # chain's middle stage cannot have that port too.
        raise UsageError("a TCP chain (--split-blocks) on this machine shapes its hops with the emulated link: use "
                         "--link emulated, hosts in .env for tc, or --backend rpc")
    if opts.link == "tc" and not (tb.iface or any(h.iface for h in tb.hosts)):
        raise UsageError("--link tc needs IFACE (in .env or --iface): the interface tc shapes on each host")
    if any(x is not None for x in opts.stage_cpu):
        if tb.remote:
            raise UsageError("--stage-cpu emulates slower devices on this machine; with hosts in .env the "
                             "stages already run on real devices (use --local to emulate)")
        if "rpc" in opts.backends:
            raise UsageError("--stage-cpu applies to the TCP backend's stage workers; use --backend tcp")
        cpushare.Hierarchy.detect()  # a clear error now rather than from every worker
    if tb.remote and opts.link == "tc" and "rpc" in opts.backends:
        for h in tb.hosts:
            try:
                import ipaddress

                ipaddress.ip_address(h.address)
            except ValueError:
                raise UsageError(f"--link tc with the rpc backend shapes by peer address: give HOSTS as IP "
                                 f"addresses, not {h.address!r}")


class Sweeper:
    def __init__(self, opts: SweepOptions, group_factory: GroupFactory | None = None) -> None:
        self.opts = opts
        self.group_factory = group_factory or Sweeper._process_group
        _check_options(opts)
        self.networks = {name: conditions_from_values(name, opts.inline_networks[name])
                         if name in opts.inline_networks else get_conditions(name, opts.network_file)
                         for name in opts.networks}
        self.session = Session(self._session_dir())
        self.dir = self.session.path
        self.group: StageGroup | None = None
        self.info: GroupInfo | None = None  # the current group's report (start)
        # (model, backend, cuts) this worker group has already run: their one-time costs (lazy
        # init, kernel selection for the shapes, allocator growth) are paid, so later runs of the
        # same cut skip the warm-up unless --warmup-every-run (without it the demo's 1 warm-up
        # batch per 10 measured was 0.04 s of a run's 0.06 s overhead).
        self.warmed: set[tuple] = set()
        self.failures: list[dict[str, Any]] = []
        self.stopping: dict[tuple, dict[str, Any]] = {}
        self.started = time.monotonic()
        self.measured_s = self.reference_s = 0.0
        self.consolidated = float("-inf")
        self.compute_s = 0.0  # the slowest batch compute (all stages) measured in this worker group
        self.cipher = "none"  # the current worker group's --encrypt choice
        self.cipher_used: str | None = None  # ...and the cipher its runs record (auto resolved)

    # -- layout --------------------------------------------------------------------------------
    def _session_dir(self) -> Path:
        return session_dir(self.opts.out, self.opts.session, self.opts.resume)

    def discard_if_unmeasured(self) -> bool:
        """Remove this session's folder when no run (nor reference run) was recorded in it."""
        if not self.dir.is_dir() or self.session.measured_anything():
            return False
        shutil.rmtree(self.dir, ignore_errors=True)
        return True

    # -- plan ----------------------------------------------------------------------------------
    def splits_for(self, num_blocks: int, fine_cuts: dict[str, list[int]] | None = None) -> list[Split]:
        """The static splits (or plans), then the fine cuts (named in --splits, or every cut of 2 to
        --max-live tensors with ``all``), then ``adaptive`` when --splits names it. ``fine_cuts``:
        the model's (:func:`paretopipe.partition.tables.fine_cut_table`); without it no cut is planned."""
        if self.opts.plans:
            bad = [p for p in self.opts.plans if max(p) > num_blocks]
            if bad:
                raise UsageError(f"--split-blocks plan {','.join(map(str, bad[0]))}: block indices go up to {num_blocks}")
            return [Split(tuple(p), plan=True) for p in self.opts.plans]
        static, adaptive = split_adaptive(self.opts.splits)
        static, named = split_cuts(static)
        blocks = [Split((k,)) for k in parse_splits(static, num_blocks)] if static else []
        return blocks + self._cut_splits(named, fine_cuts, static.strip().lower() == "all") + \
            ([Split(adaptive=True)] if adaptive else [])

    def _cut_splits(self, named: list[str], fine_cuts: dict[str, list[int]] | None, every: bool) -> list[Split]:
        limit = self.opts.max_live
        if fine_cuts is None:
            return []
        for name in named:
            if name not in fine_cuts:
                raise UsageError(f"--splits: {name!r} is not a cut of this model (python -m paretopipe.split "
                                 f"--list --fine lists them)")
            if fine_cuts[name][0] > limit:
                raise UsageError(f"--splits: {fine_cuts[name][0]} tensors cross {name}; add --max-live "
                                 f"{fine_cuts[name][0]}")
        wide = [n for n, (width, _) in fine_cuts.items() if 2 <= width <= limit] if every else []
        return [Split(cut=n) for n in dict.fromkeys(named + wide)]

    def plan(self, num_blocks: dict[str, int], fine_cuts: dict[str, dict[str, list[int]]] | None = None
             ) -> list[PlannedRun]:
        """The runs of the minimum rounds (--runs), in the order they will run; --precision and drift
        checks may add more."""
        o = self.opts
        planned = []
        for model in o.models:
            for backend, cipher in self.groups():
                configs = [(n, k) for n in o.networks for k in self.splits_for(num_blocks[model],
                                                                                (fine_cuts or {}).get(model))]
                if o.order == "sequential":
                    planned += [PlannedRun(model, backend, n, k, r, cipher=cipher) for n, k in configs
                                for r in range(o.runs)]
                    continue
                for r in range(o.runs):
                    planned += [PlannedRun(model, backend, n, k, r, cipher=cipher) for n, k in
                                rounds.round_order(configs, o.seed, group_name(model, backend, cipher), r,
                                                   o.link == "tc")]
        return planned

    def groups(self) -> list[tuple[str, str]]:
        """(backend, cipher) of each worker group of a model: the TCP backend once per cipher."""
        return [(backend, cipher) for backend in self.opts.backends
                for cipher in (self.opts.ciphers if backend == "tcp" else ["none"])]

    # -- processes -----------------------------------------------------------------------------
    def placement(self) -> Placement:
        o = self.opts
        stages = max(2, (len(o.plans[0]) + 1) if o.plans else 2)
        devices = o.stage_devices or ["cpu"] * stages
        return Placement(testbed=o.testbed, devices=devices,
                         threads=[t or o.threads for t in o.stage_threads] + [o.threads] * stages,
                         cpu_shares=o.stage_cpu, pin=o.optimizations, wait_time=o.wait_time,
                         num_classes=o.num_classes, weights=o.weights, encrypt=self.cipher)

    def _process_group(self, model: str, backend: str) -> StageGroup:
        o = self.opts
        if backend == "tcp":
            return TcpStages(self.placement(), model, shaped_port=o.link == "tc",
                             stages=(len(o.plans[0]) + 1) if o.plans else 2)
        stages = (len(o.plans[0]) + 1) if o.plans else 2
        return RpcRanks(self.placement(), model, stages, o.rpc_source, o.rpc_transport, o.timeout or deadlines.BASE_S)

    def start(self, model: str, backend: str, cipher: str = "none") -> GroupInfo:
        """Start the stage group of (model, backend) under ``cipher``; its report is the current
        :attr:`info` until the next start."""
        self.stop()
        self.warmed.clear()
        self.compute_s = 0.0
        self.cipher, self.cipher_used = cipher, None
        self.group = self.group_factory(self, model, backend)
        try:
            self.info = GroupInfo.of(self.group.start())
        except BaseException:
            self.stop()
            raise
        return self.info

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
            if any(x is not None for x in self.opts.stage_cpu):
                cpushare.remove_stale()  # groups of workers that could not clean up after themselves

    # -- one configuration ---------------------------------------------------------------------
    def run_config(self, planned: PlannedRun) -> RunConfig:
        """The typed configuration of one planned run; the record's ``config`` is exactly this."""
        o = self.opts
        info = self.info
        adaptive = planned.split.adaptive
        blocks = [info.num_blocks] if adaptive else list(planned.split.blocks)
        cuts = [planned.split.cut] if planned.split.cut else [info.block_cuts[k] for k in blocks]
        rpc = planned.backend == "rpc"
        # The adaptive run chooses among the sweep's two-stage splits: block splits, and cuts by name.
        static = [k.blocks[0] if k.blocks else k.cut for k in self.splits_for(info.num_blocks, info.fine_cuts)
                  if not (k.adaptive or k.plan)]
        candidates = static if len(static) > 1 else None
        extra = {"adaptive_split": AdaptiveOptions(objective=o.objective, candidates=candidates)} if adaptive else {}
        if not rpc:
            extra["deadline_s"] = o.deadline_s
        warmed = not adaptive and not o.warmup_every_run and self._warm_key(planned, cuts) in self.warmed
        return RunConfig(model=info.model, cuts=cuts, split_index=planned.split.config, batch_size=o.batch_size, num_batches=o.num_batches,
                         warmup=0 if warmed else o.warmup, in_flight=o.in_flight, network=planned.network,
                         link_mode=o.link, timeout_s=self.timeout_s(planned, blocks), seed=planned.run, wire_dtype=o.wire_dtype, compression=o.compression,
                         num_classes=o.num_classes, dataset=o.dataset, data_dir=o.data_dir, run_key=planned.run_key, config_key=planned.config_key,
                         run=planned.run, stage_limits=info.limits, max_batch_s=o.max_batch_s,
                         prefetch_batches=o.prefetch_batches,
                         rpc=RpcOptions(transport=o.rpc_transport, source=o.rpc_source, use_pipelining=o.in_flight > 1,
                                        world_size=info.world_size) if rpc else None,
                         energy_rate_hz=o.energy_rate_hz,
                         **self.stage_declarations(len(cuts) + 1), **extra)

    def stage_declarations(self, stages: int) -> dict[str, Any]:
        """Each stage's declared powers and memory limit: the flags', else its host's."""
        hosts = self.opts.testbed.hosts[:stages] if self.opts.testbed.remote else []

        def per_stage(flag: list, attr: str) -> list | None:
            values = []
            for j in range(stages):
                given = flag[j] if j < len(flag) else None
                values.append(given if given is not None else getattr(hosts[j], attr) if j < len(hosts) else None)
            return values if any(v is not None for v in values) else None

        o = self.opts
        return {"power_idle_w": per_stage(o.power_idle_w, "power_idle_w"),
                "power_core_w": per_stage(o.power_core_w, "power_core_w"),
                "memory_limits": per_stage(o.memory_limits, "memory_limit")}

    def timeout_s(self, planned: PlannedRun, blocks: Sequence[int]) -> float:
        """``--timeout``, else a deadline from the bytes this run sends under its network conditions
        and the compute measured so far in this group (:mod:`paretopipe.network.deadlines`)."""
        o = self.opts
        if o.timeout is not None:
            return o.timeout
        itemsize = 2 if o.wire_dtype in ("float16", "bfloat16") else 4
        per_image = self.info.payload_bytes_per_image
        if planned.split.adaptive:  # any candidate may be chosen: the largest bounds them all
            blocks = range(len(per_image))
        largest = (self.info.fine_cuts.get(planned.split.cut, [0, 0])[1] if planned.split.cut else
                   max((per_image[k] for k in blocks if k < len(per_image)), default=0))
        up = largest * o.batch_size * itemsize // 4
        down = o.num_classes * 4 * o.batch_size
        conditions = self.networks[planned.network] if o.link != "none" else None
        return deadlines.run_timeout_s(conditions, up, down, o.in_flight, self.compute_s)

    def run_one(self, planned: PlannedRun, observed: dict | None) -> dict[str, Any]:
        o = self.opts
        cfg = self.run_config(planned).to_dict()
        conditions = self.networks[planned.network].to_dict() if o.link == "emulated" else None
        budget = o.wait_time + cfg["timeout_s"] * (o.num_batches + o.warmup + 2)
        record = self.group.run(cfg, conditions, observed, budget)
        if not isinstance(record, dict) or not isinstance(record.get("summary"), dict):
            raise PeerError(f"{planned.backend}: the run returned no record")
        if record["status"] == INFEASIBLE:
            # A measured outcome; the run was cut short mid-exchange, so the stages start afresh.
            self.stop()
            return record
        if record["status"] != "complete":
            raise PeerError(record.get("error") or "run incomplete")
        self.warmed.add(self._warm_key(planned, cfg["cuts"]))
        self.cipher_used = cipher_of(record.get("manifest") or {})
        s = record["summary"]
        self.compute_s = max(self.compute_s, sum(s.get(f"stage{j}_compute_median_s") or 0.0 for j in range(1, 9)))
        return record

    @staticmethod
    def _warm_key(planned: PlannedRun, cuts: Sequence[str]) -> tuple:
        return planned.model, planned.backend, tuple(cuts)

    # -- network conditions on the hosts -------------------------------------------------------
    def _shaped_hosts(self, backend: str, stages: int) -> list[tuple[Host | None, Any]]:
        """(host, direction) pairs: every stage host's egress, the last one the way back."""
        tb = self.opts.testbed
        if not tb.remote:
            return [(None, None)]
        return [(h, "down" if j == stages - 1 else "up") for j, h in enumerate(tb.stage_hosts(stages))]

    @contextlib.contextmanager
    def _tc_context(self, backend: str, conditions: NetworkConditions) -> Iterator[dict[str, Any] | None]:
        """With --link tc: apply the conditions for the duration of a group of runs; cleared after."""
        o, tb = self.opts, self.opts.testbed
        if o.link != "tc":
            yield None
            return
        stages = (len(o.plans[0]) + 1) if o.plans else 2
        hosts = self._shaped_hosts(backend, stages)
        addresses = [h.address for h, _ in hosts if h is not None]
        with contextlib.ExitStack() as stack:
            runners = []
            controllers: list[dict[str, Any]] = []
            for host, which in hosts:
                runner = host.runner() if host is not None else tc.Runner()
                iface = (host.iface if host is not None else None) or tb.iface
                direction = conditions.direction(which) if which else conditions.up
                if backend == "tcp":
                    kw: dict[str, Any] = {"port": tb.data_port}
                elif host is not None:
                    kw = {"peers": [a for a in addresses if a != host.address],
                          "ssh_port": host.ssh_port or 22}
                else:
                    kw = {}  # RPC on one machine: its ports are not known in advance; shape the interface
                stack.enter_context(tc.applied(direction, iface, runner=runner, **kw))
                # A trace: a controller steps the shaped rate through it while the group runs, and
                # its log of applied rates is kept in the session.
                log_path = self.session.trace_control_path(f"{conditions.name}-{runner.where}-{which or 'up'}")
                ctl = stack.enter_context(tracecontrol.following(direction, iface, runner, seed=o.seed or 0,
                                                                 which=which or "up", log_path=log_path))
                if ctl is not None:
                    controllers.append({**ctl.summary(), "log": str(log_path.relative_to(self.dir))})
                runners.append((runner, iface))
            state = tc.observed_link_state(runners[0][1], runners[0][0])
            if controllers:
                state["trace_control"] = controllers
            state["conditions_requested"] = conditions.to_dict()
            if len(runners) > 1:
                state["other_hosts"] = [tc.observed_link_state(i, r) for r, i in runners[1:]]
            yield state

    # -- the sweep -----------------------------------------------------------------------------
    def run(self) -> SweepResult:
        o = self.opts
        self.started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self._load_session()
        if not o.testbed.remote and self.group_factory is Sweeper._process_group:
            zygote.prestart()
        self.measured_s = self.reference_s = 0.0
        interrupted = False
        total = 0
        failed: list[PlannedRun] = []
        try:
            for model in o.models:
                for backend, cipher in self.groups():
                    self.start(model, backend, cipher)
                    total += self._sweep_group(model, backend, meta, failed)
                    self.stop()
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping the stages; finished runs stay valid, --resume completes the rest")
        finally:
            self.stop()
            meta["interrupted"] = interrupted
            try:
                self.consolidate(meta, final=True)
            except DiskFullError as exc:
                log.error("%s", exc)
        if interrupted:
            raise KeyboardInterrupt
        measured = meta.get("runs_complete", 0) + meta.get("runs_infeasible", 0)
        if o.report and measured:
            self._report()
        return SweepResult(self.dir, total, failed, measured)

    def _sweep_group(self, model: str, backend: str, meta: dict[str, Any],
                     failed: list[PlannedRun]) -> int:
        """Every configuration of one model and backend, in rounds (see :mod:`.rounds`)."""
        from tqdm import tqdm

        o = self.opts
        group = self._group_state(model, backend, meta)
        tc_mode = o.link == "tc"
        bar = tqdm(total=len(group.configs) * o.runs, desc=group.name.replace("/", " "), unit="run",
                   dynamic_ncols=True, disable=None)
        r = 0
        while True:
            active = [c for c in group.configs if group.progress[c].stopped is None]
            if not active:
                break
            for network, members in self._segments(self._round_plan(model, backend, group, active, r), tc_mode):
                with self._tc_context(backend, self.networks[network]) if network else contextlib.nullcontext() \
                        as observed:
                    for one in members:
                        if group.progress[(one.network, one.split)].stopped is not None:
                            continue  # sequential mode: precise before its budget
                        self._measure(one, group, observed, failed)
                        bar.update(1)
                        drifted = self._drift_check(group.drift, group.reference, network or group.reference[0],
                                                    observed, model, backend, group.meta)
                        self._requeue_drifted(drifted, group, model, backend)
                        if time.monotonic() - self.consolidated >= CONSOLIDATE_EVERY_S:
                            self.consolidate(meta, final=False)
            r += 1
            for c in active:
                if group.progress[c].stopped is None and not group.rerun[c]:
                    group.progress[c].stopped = group.progress[c].decide(o.runs, o.precision, group.max_runs)
            bar.total = max(bar.total, bar.n + sum(1 for c in group.configs if group.progress[c].stopped is None))
        bar.close()
        group.meta["stopping"] = {self._config_key(model, backend, c): p.describe() for c, p in group.progress.items()}
        group.meta["drift_checks"] = [dataclasses.asdict(c) for c in group.drift.checks]
        # Keyed as summary.csv keys a configuration: by the cipher its runs used.
        self.stopping.update({(self.info.model, backend, self.cipher_used or group.cipher, n, k.label): p.describe()
                              for (n, k), p in group.progress.items()})
        return len(group.configs)

    def _group_state(self, model: str, backend: str, meta: dict[str, Any]) -> "_GroupState":
        """A group's configurations, their progress, the drift reference and the session's record of it."""
        o = self.opts
        splits = self.splits_for(self.info.num_blocks, self.info.fine_cuts)
        configs = [(n, k) for n in o.networks for k in splits]
        max_runs = o.max_runs or (3 * o.runs if o.precision else o.runs)
        static = [k for k in splits if not k.adaptive] or splits
        reference = (o.networks[0], static[len(static) // 2])
        name = group_name(model, backend, self.cipher)
        group_meta = meta.setdefault("groups", {}).setdefault(name, {})
        group_meta.update({"order": o.order, "seed": o.seed, "precision": o.precision, "min_runs": o.runs,
                           "max_runs": max_runs, "reference": {"network": reference[0], "split": reference[1].label},
                           "executed": group_meta.get("executed", [])})
        return _GroupState(name, self.cipher, configs, {c: rounds.ConfigProgress() for c in configs}, max_runs,
                           rounds.DriftMonitor(o.drift_every_s if o.order == "random" else 0.0), reference, group_meta,
                           {c: [] for c in configs})

    def _round_plan(self, model: str, backend: str, group: "_GroupState", active: list[tuple],
                    r: int) -> list[PlannedRun]:
        """Round ``r``'s runs: in random order, each active configuration's next run after the runs
        drift set aside; sequentially, every run of a configuration back to back (today's order)."""
        o, cipher = self.opts, group.cipher
        if o.order == "sequential":
            return [PlannedRun(model, backend, n, k, i, cipher=cipher) for n, k in active
                    for i in range(group.max_runs if o.precision else o.runs)]
        plan = [PlannedRun(model, backend, n, k, i, cipher=cipher) for n, k in
                rounds.round_order(active, o.seed, group.name, r, o.link == "tc")
                for i in group.rerun[(n, k)] + [r]]
        for c in active:
            group.rerun[c] = []
        return plan

    def _measure(self, one: PlannedRun, group: "_GroupState", observed: Any, failed: list[PlannedRun]) -> None:
        """One planned run (or its record from the run being resumed), counted in its configuration."""
        o = self.opts
        cfg = (one.network, one.split)
        progress = group.progress[cfg]
        record = self._resumed(one) or self._attempt(one, observed, one.model, one.backend)
        progress.attempts += 1
        group.meta["executed"].append(one.run_key)
        if record is None:
            failed.append(one)
        elif record["status"] == INFEASIBLE:
            # Measuring it again cannot make it meet the user's deadline.
            progress.stopped = INFEASIBLE
            log.warning("%s is infeasible: %s", one.run_key, record.get("error"))
        else:
            progress.add(record["summary"])
            group.drift.since.append((cfg, one.run, one.run_key))
        if o.order == "sequential" and progress.stopped is None:
            progress.stopped = progress.decide(o.runs, o.precision, group.max_runs)

    def _requeue_drifted(self, drifted: list[tuple], group: "_GroupState", model: str, backend: str) -> None:
        """Set aside the runs measured while the machine drifted and plan them again. Each run is
        measured again at most once, and each configuration at most max_runs times: a machine that
        stays slow is the new normal, not drift."""
        for (dcfg, run, key) in drifted:
            if key in group.rerun_done or dcfg not in group.progress or \
                    group.progress[dcfg].remeasured >= group.max_runs:
                continue
            group.rerun_done.add(key)
            self.session.set_aside(key)
            prog = group.progress[dcfg]
            prog.remeasured += 1
            prog.latencies, prog.throughputs = self._values_of(model, backend, dcfg)
            prog.attempts -= 1
            prog.stopped = None
            group.rerun[dcfg].append(run)

    @staticmethod
    def _segments(plan: list[PlannedRun], tc_mode: bool) -> list[tuple[str | None, list[PlannedRun]]]:
        """With tc, consecutive runs of one network share one application of its qdiscs."""
        if not tc_mode:
            return [(None, plan)]
        out: list[tuple[str | None, list[PlannedRun]]] = []
        for one in plan:
            if out and out[-1][0] == one.network:
                out[-1][1].append(one)
            else:
                out.append((one.network, [one]))
        return out

    def _config_key(self, model: str, backend: str, cfg: tuple) -> str:
        return PlannedRun(model, backend, cfg[0], cfg[1], 0, cipher=self.cipher).config_key

    def _resumed(self, planned: PlannedRun) -> dict[str, Any] | None:
        """With --resume, a run already complete is taken as it is, not measured again."""
        if not self.opts.resume or not self.session.completed(planned.run_key):
            return None
        return self.session.read_run(self.session.run_path(planned.run_key))

    def _values_of(self, model: str, backend: str, cfg: tuple) -> tuple[list[float], list[float]]:
        key = self._config_key(model, backend, cfg)
        lat, thr = [], []
        for path in sorted(self.session.runs_dir.glob(f"{key}_r*.json")):
            rec = self.session.read_run(path)
            if rec and rec["status"] == "complete" and rec["config"].get("config_key") == key:
                lat.append(rec["summary"].get("latency_median_s"))
                thr.append(rec["summary"].get("throughput_imgs_per_s"))
        return lat, thr

    def _drift_check(self, drift: rounds.DriftMonitor, reference: tuple, network: str,
                     observed: dict | None, model: str, backend: str, group_meta: dict[str, Any]) -> list:
        """Measure the reference when due; returns the runs to measure again after a drift."""
        now = time.monotonic() - self.started
        if not (drift.needs_baseline(network) or drift.due(now)):
            return []
        ref_network = network if self.opts.link == "tc" else reference[0]
        baseline = drift.needs_baseline(ref_network)
        summaries = self._reference_runs(drift.BASELINE_RUNS if baseline else 1, ref_network, reference,
                                         observed, model, backend, group_meta)
        if summaries is None:
            log.warning("the drift reference %s k=%s is infeasible under --max-batch-s: no drift checks for %s %s",
                        ref_network, reference[1].label, model, backend)
            drift.every_s = 0.0
            return []
        if summaries and not baseline and drift.suspect(ref_network, summaries[0]):
            # One run lands on one moment of the machine; before the sweep measures runs again, two
            # more runs confirm that the reference's speed moved (their median is the check).
            more = self._reference_runs(drift.CONFIRM_RUNS - 1, ref_network, reference, observed, model,
                                        backend, group_meta)
            summaries = summaries + more if more else []  # None (infeasible now) counts as a failure
        if not summaries:
            return []
        now = time.monotonic() - self.started
        if baseline:
            drift.set_baseline(ref_network, summaries, now)
            return []
        items = list(drift.since)
        check = drift.check(ref_network, summaries, now)
        if not check.drift:
            return []
        log.warning("drift: the reference %s k=%s changed throughput by %.0f%% (threshold %.0f%%); measuring the %d "
                    "runs since the last check again", ref_network, reference[1].label, 100 * check.change,
                    100 * check.threshold, len(items))
        return items

    def _reference_runs(self, count: int, network: str, reference: tuple, observed: dict | None,
                        model: str, backend: str, group_meta: dict[str, Any]) -> list[dict[str, Any]] | None:
        """``count`` runs of the reference configuration, kept apart from the sweep's; their
        summaries, none when one fails, or None when one is infeasible."""
        summaries = []
        for _ in range(count):
            n = len(group_meta.setdefault("reference_runs", []))
            planned = PlannedRun(model, backend, network, reference[1], n, reference=True, cipher=self.cipher)
            record = self._attempt(planned, observed, model, backend)
            if record is None:
                return []
            if record["status"] == INFEASIBLE:
                return None
            group_meta["reference_runs"].append(planned.run_key)
            self.reference_s += _measuring_s(record["summary"])
            summaries.append(record["summary"])
        return summaries

    def _attempt(self, planned: PlannedRun, observed: dict | None, model: str, backend: str) -> dict | None:
        for attempt in (1, 2):
            try:
                if self.group is None or not self.group.alive():
                    self.start(model, backend, planned.cipher)
                record = self.run_one(planned, observed)
                if planned.reference:  # kept apart: a reference run is not a run of the sweep
                    self._write(lambda: self.session.write_reference(planned.run_key, record),
                                self.session.reference_path(planned.run_key))
                else:
                    self._write(lambda: self.session.write_run(planned.run_key, record),
                                self.session.run_path(planned.run_key))
                    self.measured_s += _measuring_s(record["summary"])
                return record
            except DiskFullError:
                raise
            except (ParetoPipeError, OSError) as exc:
                self.failures.append({"run_key": planned.run_key, "attempt": attempt, "error": str(exc),
                                      "time_utc": records.utc_now()})
                log.warning("%s attempt %d failed: %s", planned.run_key, attempt, exc)
                # A half-finished exchange leaves the processes in an unknown state: start them afresh.
                self.stop()
                try:
                    self.start(model, backend, planned.cipher)
                except ParetoPipeError as exc2:
                    self.failures.append({"run_key": planned.run_key, "attempt": attempt,
                                          "error": f"restart failed: {exc2}", "time_utc": records.utc_now()})
                    if attempt == 2:
                        raise
        return None

    def _write(self, write, path: Path):
        """Run a write; a full disk becomes one DiskFullError naming the path and the space left."""
        try:
            return write()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(self.dir).free if self.dir.exists() else 0
                raise DiskFullError(f"disk full: cannot write {path} ({free} bytes free on that file system); "
                                    f"free some space and run the sweep again with --resume")
            raise

    def _load_session(self) -> dict[str, Any]:
        opts = dataclasses.asdict(self.opts)
        opts["testbed"] = self.opts.testbed.describe()
        meta = {"schema_version": records.SCHEMA_VERSION, "created_utc": records.utc_now(),
                "options": opts, "manifest": node_manifest(role="controller"),
                "networks": {n: c.to_dict() for n, c in self.networks.items()}}
        try:
            old = self.session.read_meta()
        except UsageError as exc:
            log.warning("%s: starting the session file afresh", exc)
            old = None
        if old is not None:
            meta["created_utc"] = old.get("created_utc", meta["created_utc"])
            meta["resumed_utc"] = list(old.get("resumed_utc") or []) + [records.utc_now()]
            self.failures = list(old.get("failures") or [])
        return meta

    # -- consolidation -------------------------------------------------------------------------
    def consolidate(self, meta: dict[str, Any], final: bool) -> None:
        """runs.csv and session.json after every run; summary.csv (CIs of the medians over runs) at the end.
        The run records are the source of truth: a later consolidation rebuilds everything else."""
        rows, skipped = self._write(lambda: self.session.consolidate(self.failures, final, self.stopping),
                                    self.dir / "runs.csv")
        self.consolidated = time.monotonic()
        wall, measured_s = time.monotonic() - self.started, self.measured_s
        meta.update({"updated_utc": records.utc_now(), "complete": final and not meta.get("interrupted"),
                     "runs_complete": sum(r["status"] == "complete" for r in rows),
                     "runs_infeasible": sum(r["status"] == INFEASIBLE for r in rows),
                     "unreadable_runs": skipped,
                     "timing": {"wall_s": wall, "measured_s": measured_s, "reference_s": self.reference_s,
                                "overhead_s": wall - measured_s,
                                "overhead_ratio": (wall - measured_s) / measured_s if measured_s else None,
                                "note": "measured_s sums the measured spans of this invocation's runs (first "
                                        "measured batch's start to last completion); "
                                        "overhead is everything else (start-up, model builds, warm-up, "
                                        "handshakes, writing, and the drift checks' reference runs, "
                                        "reference_s of measuring)"},
                     "failures": self.failures})
        self._write(lambda: self.session.write_meta(meta), self.session.meta_path)

    def _report(self) -> None:
        from ..analysis import report

        report.write_report(self.dir, self.dir / "report", objectives=self.opts.objectives)


def group_name(model: str, backend: str, cipher: str) -> str:
    """A worker group's name in session.json and its seed of the round order (a plain group keeps
    the name it had before ciphers, so its order is what it was)."""
    return f"{model}/{backend}" + (f"/{cipher}" if cipher != "none" else "")


def _measuring_s(summary: dict[str, Any]) -> float:
    """How long a run spent measuring: its span, fill included (a record from before spans: its window)."""
    return summary.get("measured_span_s") or summary.get("measured_window_s") or 0.0


def describe_plan(planned: Sequence[PlannedRun], opts: SweepOptions) -> str:
    per = opts.warmup + opts.num_batches
    where = ("locally" if not opts.testbed.remote else
             "on " + ", ".join(f"{h.address} ({h.device})" for h in opts.testbed.hosts))
    ciphers = f" x ciphers {', '.join(opts.ciphers)} (tcp)" if opts.ciphers != ["none"] else ""
    lines = [f"{len(planned)} runs {where}: models {', '.join(opts.models)} x backends {', '.join(opts.backends)}"
             f"{ciphers} x "
             f"networks {', '.join(opts.networks)} x splits ({opts.splits if not opts.plans else 'plans'}) x "
             f"{opts.runs} runs; {per} batches of {opts.batch_size} each ({opts.warmup} warm-up"
             + (")" if opts.warmup_every_run or not opts.warmup else ", on a cut's first run in each worker group)"),
             f"order: {opts.order}" + (f" (seed {opts.seed}), one round per run" if opts.order == "random" else "")
             + (f"; --precision {opts.precision:.0%}: up to {opts.max_runs or 3 * opts.runs} runs per configuration"
                if opts.precision else "")]
    lines += [f"  {p.run_key}" for p in planned[:10]]
    if len(planned) > 10:
        lines.append(f"  ... and {len(planned) - 10} more")
    return "\n".join(lines)
