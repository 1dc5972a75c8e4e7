"""The processes that run a sweep's stages, as the sweep sees them: what a stage group does
(:class:`StageGroup`), what it reports of the model (:class:`GroupInfo`, checked field by field),
how the real ones are made, and one group's configurations while they are measured."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

from ... import engines, strict
from ...analysis.keys import CLOSED_LOOP, NO_FAULT
from ...analysis.session import GroupMeta
from ...errors import PeerError
from ...network import deadlines
from ...network.conditions import NetworkConditions
from ...network.linkdown import LinkDown
from ...runrecord import RunRecord
from ...splitspec import is_cut_name
from ...transport.runconfig import RunConfig
from . import rounds
from ..llamacpp_peer import LlamaCppPeer
from ..processes import Placement, RpcRanks, TcpStages
from .options import SweepOptions, stage_count


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

    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float, cpu_traces: dict[str, str] | None = None, link_down: LinkDown | None = None
            ) -> RunRecord: ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


class GroupOwner(Protocol):
    """What a group factory reads of the sweeper: its options and the current group's cipher."""

    opts: SweepOptions
    cipher: str
    transport: str
    group_pass: GroupPass

    def traced_stages(self) -> set[str]: ...

    def mqtt_users(self, stages: int) -> list[dict[str, Any]] | None: ...


#: Makes the stage group of one (model, backend) under the sweeper's current cipher; the default
#: starts real processes.
GroupFactory = Callable[[GroupOwner, str, str], StageGroup]


@dataclasses.dataclass(frozen=True)
class GroupPass:
    """One pass of a worker group over its configurations: its backend, the data port's cipher and
    transport, the load it is measured under (the closed loop or a LoadGen scenario) and, for a
    language model, the prompt length, the fault its runs survive, of several the wire dtype, and
    the hosts it runs on (--placements). Passes that differ only in prompt, fault or wire dtype
    share the group's processes."""

    backend: str
    cipher: str = "none"
    transport: str = "tcp"
    scenario: str = CLOSED_LOOP
    prompt_len: int | None = None
    fault: str = NO_FAULT
    wire_dtype: str | None = None  # one of several --wire-dtype (None: the sweep's only one)
    placement: str | None = None   # one of --placements (analysis.keys.placement_label), or none given
    engine: str | None = None      # one of several --engine labels (None: the sweep's only one)

    def name(self, model: str) -> str:
        """The pass's name in session.json and its seed of the round order (a plain group over raw
        TCP keeps the name it had before ciphers and transports, so its order is what it was; a
        LoadGen scenario's group ends in the scenario, a prompt length's in ``p<tokens>``)."""
        return (f"{model}/{self.backend}" + (f"/{self.cipher}" if self.cipher != "none" else "")
                + (f"/{self.transport}" if self.transport != "tcp" else "")
                + (f"/{self.scenario}" if self.scenario != CLOSED_LOOP else "")
                + (f"/p{self.prompt_len}" if self.prompt_len else "")
                + (f"/{self.fault}" if self.fault != NO_FAULT else "")
                + (f"/{self.wire_dtype}" if self.wire_dtype else "")
                + (f"/h{self.placement}" if self.placement else "")
                + (f"/{self.engine}" if self.engine else ""))

    @property
    def processes(self) -> tuple[str, str, str]:
        """What its processes are started with: a pass that changes none of these keeps them."""
        return self.backend, self.cipher, self.transport


@dataclasses.dataclass
class GroupProgress:
    """One model and backend's configurations while they are measured: each one's progress, the
    drift monitor and its reference, the runs drift set aside to measure again, and the session's
    record of the group (``meta``)."""

    name: str
    cipher: str | None
    transport: str
    configs: list[tuple]
    progress: dict[tuple, rounds.ConfigProgress]
    max_runs: int
    drift: rounds.DriftMonitor
    reference: tuple
    meta: GroupMeta  # its account in session.json
    rerun: dict[tuple, list[int]]
    rerun_done: set[str] = dataclasses.field(default_factory=set)
    group_pass: GroupPass | None = None  # the load and prompt its runs are measured under

    @property
    def scenario(self) -> str:
        return self.group_pass.scenario if self.group_pass else CLOSED_LOOP


def placement(opts: SweepOptions, cipher: str, traced: set[str] = frozenset(), transport: str = "tcp",
              mqtt: list[dict[str, Any]] | None = None) -> Placement:
    """Where and how each stage process runs: hosts, devices, threads, CPU shares, pinning. A
    stage some run replays a compute trace on gets a group at a full core until the trace moves it."""
    stages = max(2, stage_count(opts))
    devices = opts.stage_devices or ["cpu"] * stages
    shares = [1.0 if share is None and f"stage{j + 1}" in traced else share for j, share in enumerate(opts.stage_cpu)]
    return Placement(testbed=opts.testbed, devices=devices,
                     threads=[t or opts.threads for t in opts.stage_threads] + [opts.threads] * stages,
                     cpu_shares=shares, pin=opts.optimizations, wait_time=opts.wait_time,
                     num_classes=opts.num_classes, weights=opts.weights, model_dir=opts.model_dir, encrypt=cipher,
                     transport=transport,
                     mqtt=mqtt)


def process_group(sweeper: GroupOwner, model: str, backend: str) -> StageGroup:
    """The default :data:`GroupFactory`: real stage processes, here or on the testbed's hosts; for
    a pass of the llama.cpp peer, its own two processes and the relay between them."""
    o = sweeper.opts
    if engines.is_peer(sweeper.group_pass.engine or o.engines[0]):
        return LlamaCppPeer(placement(o, "none"), model, max(2, stage_count(o)))
    where = placement(o, sweeper.cipher, sweeper.traced_stages(), sweeper.transport,
                      sweeper.mqtt_users(max(2, stage_count(o))) if backend == "tcp" else None)
    if backend == "tcp":
        return TcpStages(where, model, shaped_port=o.link == "tc", stages=stage_count(o))
    return RpcRanks(where, model, stage_count(o), o.rpc_source, o.rpc_transport, o.timeout or deadlines.BASE_S)
