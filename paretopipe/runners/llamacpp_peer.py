"""llama.cpp's RPC split as a sweep's stage group (``--engine llamacpp``): its two workers
(:mod:`.llamacpp_worker`), here or on the testbed's first two hosts, started as our engine's stage
workers are. Stage 2's worker runs ``ggml-rpc-server``; stage 1's runs the relay in front of it,
``llama-server`` through the relay, and each configuration, and answers with the run's record, to
which this group adds stage 2's node.

On hosts the server listens on the testbed's data port, so that ``--link tc`` shapes llama.cpp's
traffic as it shapes ours; the relay on stage 1's host then only counts."""

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
    """The two llama.cpp workers of a sweep (a :class:`StageGroup`)."""

    backend = "tcp"

    def __init__(self, placement: Placement, model: str) -> None:
        self.p, self.model = placement, model
        tb = placement.testbed
        self.hosts: list[Host | None] = list(tb.stage_hosts(2)) if tb.remote else [None, None]
        self.procs: list[StageProcess] = []
        self.server: dict[str, Any] = {}

    def _options(self, j: int, **side: Any) -> list[str]:
        local = self.hosts[j] is None
        share = self.p.cpu_shares[j] if local and j < len(self.p.cpu_shares) else None
        return PeerOptions(model=self.model, model_dir=self.p.model_dir, threads=self.p.threads_for(j, 2),
                           cpus=self.p.local_cpus(j, 2) if local else None, cpu_share=share,
                           wait_time=self.p.wait_time, **side).to_argv()

    def start(self) -> dict[str, Any]:
        remote = self.hosts[1] is not None
        server = spawn_process("llama.cpp stage 2", MODULE, self._options(
            1, side="server", host="0.0.0.0" if remote else "127.0.0.1",
            port=self.p.testbed.data_port if remote else 0), self.hosts[1])
        self.procs = [server]
        self.server = server.ready(self.p.wait_time)
        address = self.hosts[1].address if remote else "127.0.0.1"
        client = spawn_process("llama.cpp stage 1", MODULE, self._options(0, side="client", rpc=f"{address}:"
                                                                   f"{int(self.server['port'])}"), self.hosts[0])
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
        if isinstance(stages, list) and len(stages) == 2 and isinstance(stages[1], dict):
            stages[1] = {**dict(self.server.get("manifest") or {}), **stages[1], "pid": self.server.get("pid")}
        return received_record(event, "llama.cpp's stage 1")

    def alive(self) -> bool:
        return bool(self.procs) and all(proc.alive() for proc in self.procs)

    def stop(self) -> None:
        stop_all(self.procs)
        self.procs = []
