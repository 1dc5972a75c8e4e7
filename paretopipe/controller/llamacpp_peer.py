"""llama.cpp's RPC split as a sweep's stage group (``--engine llamacpp``): its workers
(:mod:`.llamacpp_worker`), here or on the testbed's hosts, started as our engine's stage workers
are. Each stage after the first is a worker running ``ggml-rpc-server`` (a plan of several cuts,
``--split-blocks``, has several); stage 1's runs a relay in front of each, ``llama-server``
through them, and each configuration, and answers with the run's record, to which this group adds
each server's node.

On hosts each server listens on the testbed's data port, so that ``--link tc`` shapes llama.cpp's
traffic as it shapes ours; the relays on stage 1's host then only count."""

from __future__ import annotations

from typing import Any

from ..errors import PeerError
from ..network.conditions import NetworkConditions
from ..runrecord import RunRecord
from ..transport.runconfig import RunConfig
from .commands import RunCommand, encode
from .hosts import Host, StageProcess, stop_all
from .llamacpp_worker import MODULE, PeerOptions
from .processes import Placement, received_record, spawn_process


class LlamaCppPeer:
    """The llama.cpp workers of a sweep (a :class:`StageGroup`): ``llama-server``'s and one per RPC server."""

    backend = "tcp"

    def __init__(self, placement: Placement, model: str, stages: int = 2) -> None:
        self.p, self.model, self.stages = placement, model, stages
        tb = placement.testbed
        self.hosts: list[Host | None] = list(tb.stage_hosts(stages)) if tb.remote else [None] * stages
        self.procs: list[StageProcess] = []
        self.servers: list[dict[str, Any]] = []  # each server worker's ready event

    def _options(self, j: int, **side: Any) -> list[str]:
        local = self.hosts[j] is None
        share = self.p.cpu_shares[j] if local and j < len(self.p.cpu_shares) else None
        return PeerOptions(model=self.model, model_dir=self.p.model_dir, threads=self.p.threads_for(j, self.stages),
                           cpus=self.p.local_cpus(j, self.stages) if local else None, cpu_share=share,
                           wait_time=self.p.wait_time, **side).to_argv()

    def start(self) -> dict[str, Any]:
        addresses = []
        for j in range(1, self.stages):
            host = self.hosts[j]
            server = spawn_process(f"llama.cpp stage {j + 1}", MODULE, self._options(
                j, side="server", host="0.0.0.0" if host else "127.0.0.1",
                port=self.p.testbed.data_port if host else 0), host)
            self.procs.append(server)
            self.servers.append(server.ready(self.p.wait_time))
            addresses.append(f"{host.address if host else '127.0.0.1'}:{int(self.servers[-1]['port'])}")
        client = spawn_process("llama.cpp stage 1", MODULE, self._options(0, side="client", rpc=",".join(addresses)),
                               self.hosts[0])
        self.procs.insert(0, client)
        return {k: v for k, v in client.ready(self.p.wait_time).items() if k != "pid"}

    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float, cpu_traces: dict[str, str] | None = None, link_down: Any = None) -> RunRecord:
        if not self.procs:
            raise PeerError("llama.cpp's workers are not started")
        client = self.procs[0]
        client.send(encode(RunCommand(config=cfg.to_dict(), conditions=conditions.to_dict() if conditions else None,
                                      observed_link=observed)))
        event = client.expect("done", timeout=budget)
        record = event.get("record")
        stages = (record or {}).get("manifest", {}).get("stages") if isinstance(record, dict) else None
        if isinstance(stages, list) and len(stages) == self.stages and all(isinstance(s, dict) for s in stages):
            for j, server in enumerate(self.servers, start=1):
                stages[j] = {**dict(server.get("manifest") or {}), **stages[j], "pid": server.get("pid")}
        return received_record(event, "llama.cpp's stage 1")

    def alive(self) -> bool:
        return bool(self.procs) and all(proc.alive() for proc in self.procs)

    def stop(self) -> None:
        stop_all(self.procs)
        self.procs, self.servers = [], []
