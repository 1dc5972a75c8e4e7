"""A stage group with scripted speeds, for testing the sweep's mechanisms in seconds.

Rounds, drift checks, rebaselining, precision, resume and retries are decisions the sweep takes on
the numbers its runs return. Tested against real stages, they depended on how fast and how noisy
this VM was at that moment (a drift test with busy processes failed CI at random). Here each run's
per-batch latency comes from a script, so every decision is reproducible; the real plumbing is
proven by the end-to-end sweeps in test_sweep.py. No process, socket or model is involved: the
records are built by the same ``records.build_run_record`` the backends use."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from paretopipe import records, runrecord
from paretopipe.errors import PeerError
from paretopipe.network.conditions import NetworkConditions
from paretopipe.transport.runconfig import RunConfig

#: (config dict, index of this call among all runs of the group) -> seconds per batch, or an
#: exception to raise.
Script = Callable[[dict[str, Any], int], "float | BaseException"]


@dataclasses.dataclass
class ScriptedGroup:
    model: str
    backend: str
    script: Script
    num_blocks: int = 8
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    started: int = 0
    stopped: int = 0
    _alive: bool = False

    def start(self) -> dict[str, Any]:
        self.started += 1
        self._alive = True
        cuts = ["input"] + [f"block{k}" for k in range(1, self.num_blocks)] + ["output"]
        return {"model": self.model, "num_blocks": self.num_blocks, "block_cuts": cuts, "fingerprint": "scripted",
                "payload_bytes_per_image": [1000 * (self.num_blocks + 1 - k) for k in range(self.num_blocks + 1)],
                "limits": {}}

    def run(self, config: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float) -> runrecord.RunRecord:
        cfg = config.to_dict()  # what the script reads, as a process would receive it
        outcome = self.script(cfg, len(self.calls))
        self.calls.append(cfg)
        if isinstance(outcome, BaseException):
            self._alive = not isinstance(outcome, PeerError)
            raise outcome
        latency = float(outcome)
        batches = [{"seq": i, "warmup": i < cfg["warmup"], "start_s": i * latency, "end_s": (i + 1) * latency,
                    "latency_s": latency, "stage1_compute_s": latency / 2, "stage2_compute_s": latency / 4,
                    "payload_bytes": 1000, "wire_bytes": 1000, "result_wire_bytes": 40}
                   for i in range(cfg["warmup"] + cfg["num_batches"])]
        # As the real groups return it: the record its process wrote, read back as the type.
        return runrecord.RunRecord.of(records.build_run_record(
            backend=self.backend, run_id=f"scripted-{len(self.calls)}", status="complete", error=None, config=cfg,
            manifest={"link": {"mode": "scripted"}}, batches=batches, sysmon={}))

    def alive(self) -> bool:
        return self._alive

    def stop(self) -> None:
        self.stopped += 1
        self._alive = False


def factory(script: Script, groups: list[ScriptedGroup] | None = None, num_blocks: int = 8):
    """A ``group_factory`` for :class:`paretopipe.controller.sweep.Sweeper`; each group made is
    appended to ``groups``, and all of them share one list of calls (the script's clock)."""
    made = groups if groups is not None else []
    calls: list[dict[str, Any]] = []

    def make(sweeper, model: str, backend: str) -> ScriptedGroup:
        group = ScriptedGroup(model, backend, script, num_blocks, calls)
        made.append(group)
        return group

    return make
