"""The long-lived processes of a sweep, for one model: a pair of TCP stage workers, or a group of
RPC ranks. Each lives here or on a testbed host, is started once per model (its weights come from
the cache), re-partitions in place for every configuration, and is stopped by the PID it reported.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from typing import Any

from ..compute import cpushare
from ..errors import PeerError, UsageError
from ..network.conditions import NetworkConditions
from ..network.linkdown import LinkDown
from ..runrecord import RunRecord
from ..transport.runconfig import RunConfig
from ..partition.names import DEFAULT_NUM_CLASSES
from .commands import ConnectCommand, ListenCommand, RunCommand, Stage1RunCommand, encode
from .faultinject import APPLIED, LinkFault, StageFault
from .hosts import check_device_name, Host, StageProcess, stop_all, Testbed
from .rpc_ranks import RankOptions
from .worker import WorkerOptions

WORKER = "paretopipe.controller.worker"
RANKS = "paretopipe.controller.rpc_ranks"


@dataclasses.dataclass
class Placement:
    """How the sweep runs its stages: devices, threads, CPU pinning and shares per stage."""

    testbed: Testbed
    devices: list[str]                  # one per stage (local runs)
    threads: list[int | None]           # torch threads per stage
    cpu_shares: list[float | None]
    pin: bool = True                    # local: each stage on its own share of the cores
    wait_time: float = 120.0
    num_classes: int = DEFAULT_NUM_CLASSES
    weights: str | None = None
    model_dir: str | None = None        # a language model's folder (on every host)
    encrypt: str = "none"               # the TCP data port's cipher choice (transport.aead)
    transport: str = "tcp"              # the data port's protocol (transport.messaging)
    mqtt: list[dict[str, Any]] | None = None  # per stage: its broker settings (MqttSettings fields)

    def mqtt_for(self, stage: int) -> dict[str, Any] | None:
        return self.mqtt[stage] if self.transport == "mqtt" and self.mqtt else None

    def local_cpus(self, stage: int, stages: int) -> str | None:
        cores = os.cpu_count() or 1
        if not self.pin or cores < stages:
            return None
        per = cores // stages
        return f"{stage * per}-{stage * per + per - 1}"

    def threads_for(self, stage: int, stages: int, cores: int | None = None) -> int:
        """The stage's threads: as given, else its part of the cores, but no more than its CPU
        share rounds up to (cpushare.threads_within)."""
        if stage < len(self.threads) and self.threads[stage]:
            return self.threads[stage]
        share = self.cpu_shares[stage] if stage < len(self.cpu_shares) else None
        return cpushare.threads_within(share, max(1, (cores or os.cpu_count() or 1) // stages))

    def device_for(self, stage: int, host: Host | None) -> str:
        if host is not None:
            return host.device
        return self.devices[stage] if stage < len(self.devices) else "cpu"


def spawn_process(role: str, module: str, args: list[str], host: Host | None,
                  env: dict[str, str] | None = None) -> StageProcess:
    """``python -m module args`` as a sweep's process speaking JSON lines: here, or on ``host`` over SSH."""
    if host is None:
        return StageProcess(role, [sys.executable, "-m", module, *args], env=env)
    return StageProcess(f"{role} on {host.address}", host.argv(module, args, env, fork=True), ssh=host.ssh())


def received_record(event: dict[str, Any], who: str) -> RunRecord:
    """The record a ``done`` event carries, checked field by field: it comes from another process,
    over SSH on a testbed."""
    try:
        return RunRecord.of(event.get("record"), f"{who}'s record")
    except UsageError as exc:
        raise PeerError(str(exc))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TcpStages:
    """The TCP stage workers, joined in a chain (stage 1 -> ... -> stage N; two in a pair) by
    authenticated sessions that carry every run. A middle stage listens for the next one."""

    backend = "tcp"

    def __init__(self, placement: Placement, model: str, shaped_port: bool, stages: int = 2) -> None:
        self.p, self.model, self.stages = placement, model, stages
        tb = placement.testbed
        self.hosts: list[Host | None] = list(tb.stage_hosts(stages)) if tb.remote else [None] * stages
        self.port = tb.data_port if (tb.remote or shaped_port) else 0
        self.procs: list[StageProcess] = []
        self.ports: list[int] = []  # each stage's data listener (the last stage has none)
        self.info: dict[str, Any] = {}

    def _spawn_stage(self, j: int, host: Host | None) -> StageProcess:
        p = self.p
        local = host is None
        args = WorkerOptions(role="stage1" if j == 0 else "stage2", model=self.model, model_dir=p.model_dir,
                             num_classes=p.num_classes,
                             weights=p.weights, device=p.device_for(j, host), threads=p.threads_for(j, self.stages),
                             cpus=p.local_cpus(j, self.stages) if local else None,
                             cpu_share=p.cpu_shares[j] if local and j < len(p.cpu_shares) else None).to_argv()
        return spawn_process(f"stage{j + 1}", WORKER, args, host)

    def start(self) -> dict[str, Any]:
        p = self.p
        self.procs = [self._spawn_stage(j, host) for j, host in enumerate(self.hosts)]
        infos = [proc.ready(p.wait_time) for proc in self.procs]
        odd = next((j for j, i in enumerate(infos) if i["fingerprint"] != infos[0]["fingerprint"]), None)
        if odd is not None:
            raise PeerError(f"stage 1 and stage {odd + 1} build different weights for {self.model} "
                            f"({infos[0]['fingerprint']} vs {infos[odd]['fingerprint']}): check torch versions and "
                            f"models/*.pth (paretopipe doctor)")
        remote = self.hosts[0] is not None
        self.procs[0].send(encode(ListenCommand(host="0.0.0.0" if remote else "127.0.0.1", port=self.port,
                                                secret=p.testbed.secret, encrypt=p.encrypt, transport=p.transport,
                                                mqtt=p.mqtt_for(0))))
        self.ports = [self.procs[0].expect("listening", timeout=p.wait_time)["port"]]
        for j in range(1, self.stages):
            self._connect(j)
        self.info = {**infos[0], "limits": {f"stage{j + 1}": i.get("limits") for j, i in enumerate(infos)},
                     "devices": [p.device_for(j, h) for j, h in enumerate(self.hosts)]}
        return self.info

    def _connect(self, j: int) -> None:
        """Stage ``j`` connects to the listener of the stage before (a middle stage listens too)."""
        p, before = self.p, self.hosts[j - 1]
        middle = j < self.stages - 1  # a middle stage: the next one connects to its own listener
        self.procs[j].send(encode(ConnectCommand(
            host=before.address if before is not None else "127.0.0.1", port=self.ports[j - 1],
            secret=p.testbed.secret, encrypt=p.encrypt, transport=p.transport, mqtt=p.mqtt_for(j),
            connect_timeout=p.wait_time, next_port=self.port if middle else None,
            next_host="0.0.0.0" if self.hosts[0] is not None else "127.0.0.1")))
        if middle:
            self.ports[j:j + 1] = [self.procs[j].expect("listening", timeout=p.wait_time)["port"]]
        self.procs[j].expect("connected", timeout=p.wait_time)

    def _restart_stage2(self) -> None:
        """A new stage 2 after a fault killed the last one: started, ready, connected to stage 1's
        listener (which stage 1 takes at its next batch); in a chain, listening for stage 3, which
        lost its connection with the old one and connects again."""
        self.procs[1] = self._spawn_stage(1, self.hosts[1])
        self.procs[1].ready(self.p.wait_time)
        self._connect(1)
        if self.stages == 3:
            self._connect(2)

    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float, cpu_traces: dict[str, str] | None = None, link_down: LinkDown | None = None) -> RunRecord:
        """One run; ``link_down``: the link tc shapes, which a ``link:down`` fault takes down when
        stage 1 asks (without it, stage 1 holds its own emulated link's frames)."""
        s1 = self.procs[0]
        s1.send(encode(Stage1RunCommand(config=cfg.to_dict(), conditions=conditions.to_dict() if conditions else None,
                                        observed_link=observed, connect_timeout=self.p.wait_time,
                                        cpu_traces=self._trace_specs(cpu_traces) if cpu_traces else None)))
        if cfg.fault is None or (cfg.fault.target == "link" and conditions is not None):  # stage 1 holds its frames
            return received_record(s1.expect("done", timeout=budget), "stage 1")
        with StageFault(cfg.fault, self.procs[1], self._restart_stage2) if cfg.fault.target == "stage2" else \
                LinkFault(cfg.fault, link_down) as fault:
            while (event := s1.expect("done", "fault", timeout=budget))["event"] == "fault":
                try:
                    fault.apply()
                    s1.send({"cmd": APPLIED})
                except PeerError as exc:
                    s1.send({"cmd": APPLIED, "error": str(exc)})
        if fault.error is not None:
            raise PeerError(f"{'stage 2' if cfg.fault.target == 'stage2' else 'the link'} after {cfg.fault.label}: "
                            f"{fault.error}")
        return received_record(event, "stage 1")

    def _trace_specs(self, cpu_traces: dict[str, str]) -> list[dict[str, Any]]:
        """Each traced stage's group (from its worker's limits) with its trace, for stage 1 to replay
        (every stage of a traced run is a local process: the sweep refused hosts)."""
        specs = []
        for stage, path in sorted(cpu_traces.items()):
            group = (self.info.get("limits", {}).get(stage) or {}).get("cgroup")
            if group is None:
                raise UsageError(f"{stage} has no CPU group to replay {path} on (is it a stage of this run?)")
            specs.append({"stage": stage, "cgroup": group, "trace": path, "offset_s": None})
        return specs

    def alive(self) -> bool:
        return bool(self.procs) and all(proc.alive() for proc in self.procs)

    def stop(self) -> None:
        stop_all(self.procs)
        self.procs = []


class RpcRanks:
    """The ranks of one RPC group: the master (rank 0, driven by JSON lines) and one rank per stage
    that the master does not compute itself."""

    backend = "rpc"

    def __init__(self, placement: Placement, model: str, stages: int, source: str, transport: str,
                 timeout: float) -> None:
        # lazy for start-up: torch
        from ..transport.rpc import layout

        self.p, self.model, self.stages, self.source, self.transport = placement, model, stages, source, transport
        self.timeout = timeout
        tb = placement.testbed
        self.stage_hosts: list[Host | None] = list(tb.stage_hosts(stages)) if tb.remote else [None] * stages
        self.layout = layout(stages, source)
        self.world = max(self.layout) + 1
        self.procs: list[StageProcess] = []
        self.info: dict[str, Any] = {}

    def _rank_host(self, rank: int) -> tuple[Host | None, int]:
        """The host of a rank and the stage it runs (the master: host 0, stage 0 or none)."""
        if rank in self.layout:
            stage = self.layout.index(rank)
            return self.stage_hosts[stage], stage
        return self.stage_hosts[0], 0

    def start(self) -> dict[str, Any]:
        p, tb = self.p, self.p.testbed
        remote = self.stage_hosts[0] is not None
        addr = self.stage_hosts[0].address if remote else "127.0.0.1"
        port = tb.rpc_port if remote else free_port()
        devices = ",".join(p.device_for(stage, host) for host, stage in map(self._rank_host, range(self.world)))
        for rank in range(self.world):
            host, stage = self._rank_host(rank)
            args = RankOptions(rank=rank, world_size=self.world, master_addr=addr, master_port=port, model=self.model,
                               model_dir=p.model_dir, num_classes=p.num_classes, weights=p.weights,
                               device=p.device_for(stage, host), threads=p.threads_for(stage, self.stages),
                               transport=self.transport, join_timeout=max(self.timeout, p.wait_time),
                               source=self.source, rank_devices=devices,
                               cpu_share=self._share_of(rank) if host is None else None).to_argv()
            env = None
            if host is not None and (host.iface or tb.iface):
                iface = host.iface or tb.iface
                env = {"TP_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}
            self.procs.append(spawn_process("rpc master" if rank == 0 else f"rpc rank {rank}", RANKS, args, host, env))
        infos = [proc.ready(p.wait_time) for proc in self.procs]
        # The master builds every other rank's stage there and checks its weights before it joins.
        self.procs[0].expect("joined", timeout=p.wait_time)
        self.info = {**infos[0], "world_size": self.world, "stage_ranks": self.layout,
                     "limits": {f"stage{j + 1}": infos[r].get("limits") for j, r in enumerate(self.layout)},
                     "devices": [p.device_for(j, h) for j, h in enumerate(self.stage_hosts)]}
        return self.info

    def _share_of(self, rank: int) -> float | None:
        """The CPU share of the stage a rank computes (--stage-cpu); none for a master that only
        feeds the data (rpc_source master): it emulates no device's compute."""
        if rank not in self.layout:
            return None
        stage = self.layout.index(rank)
        return self.p.cpu_shares[stage] if stage < len(self.p.cpu_shares) else None

    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float) -> RunRecord:
        master = self.procs[0]
        master.send(encode(RunCommand(config=cfg.to_dict(), conditions=conditions.to_dict() if conditions else None,
                                      observed_link=observed)))
        return received_record(master.expect("done", timeout=budget), "the rpc master")

    def alive(self) -> bool:
        return bool(self.procs) and all(proc.alive() for proc in self.procs)

    def stop(self) -> None:
        for proc in self.procs:  # the master first: it shuts the group down
            proc.stop()
        self.procs = []


def check_stage_devices(devices: list[str], stages: int) -> list[str]:
    if len(devices) not in (0, 1, stages):
        raise UsageError(f"--stage-devices {','.join(devices)}: give one device per stage ({stages})")
    return [check_device_name(d, "--stage-devices") for d in (devices * stages if len(devices) == 1 else devices)]
