"""A stage on an RPC rank, and where results land on the master. Both are objects owned by their
rank and reached through remote references (``torch.distributed.rpc.RRef``), as in PyTorch's
pipeline over RPC: the master constructs each rank's :class:`RankStage` there (``rpc.remote``),
configures it before every run, and each stage sends its output on to the next stage's
reference, the last one to the master's :class:`Collector`. No state lives in a module: a rank
holds what the master built on it, nothing else."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

from torch.distributed.rpc import RRef

from ... import strict
from ...errors import PeerError
from ...manifest import node_manifest
from ...network.conditions import Direction
from ...network.emulated import EmulatedLink, LinkSender
from ...partition.activation import Activation, activation_nbytes, to_host
from ...partition.stages import StageTimer
from ..generation import GenerationStage
from ..resources import stage_meter
from ..runconfig import RunConfig
from ..stagemodel import stage_builder
from .agent import NO_RPC_TIMEOUT

log = logging.getLogger("paretopipe.rpc")


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """What a rank builds, as the master asks for it: the model (a zoo name, a model file, a
    language model's name or folder), its head and weights (paths on that rank's host), and the
    device it computes on."""

    model: str
    model_dir: str | None = None
    num_classes: int | None = None
    weights: str | None = None
    models_dir: str | None = None
    device: str = "cpu"


def _nbytes(x: Any) -> int:
    return 0 if x is None else activation_nbytes(x)


class _RankRun:
    """One run of one rank's stage: its place in the plan, its stage (an image model's here; a
    generation's, with KV caches, in :class:`_RankSteps`), the emulated link its output takes and
    its energy meter."""

    def __init__(self, builder: Any, cfg: RunConfig, index: int, target: RRef, direction: dict | None) -> None:
        self.builder, self.cfg, self.index, self.target = builder, cfg, index, target
        self._build_stage()
        link = EmulatedLink(Direction.from_dict(direction), seed=cfg.seed + index) if direction else None
        self.sender = LinkSender(link, f"rpc-send-{index}")
        self.meter = stage_meter(builder, cfg, index).start()
        self.timer = StageTimer(builder.device)
        self.lock = threading.Lock()

    def _build_stage(self) -> None:
        self.stage = self.builder.stage(list(self.cfg.cuts), self.index)

    def compute(self, seq: int, x: Any, meta: dict | None) -> tuple[Any, float, dict | None]:
        """This stage's part of a batch: (what goes on, its compute seconds, the meta it carries)."""
        out, compute_s = self.timer.run(self.stage, x, self.builder.device)
        return to_host(out), compute_s, None

    def receive(self, seq: int, x: Activation, hops: list[list[float]], meta: dict | None) -> None:
        arrived = time.monotonic()
        measured = seq >= self.cfg.warmup
        if measured:
            self.meter.begin()
        with self.lock:  # one batch at a time per stage, as in a pipeline
            began = time.monotonic()
            out, compute_s, meta = self.compute(seq, x, meta)
        hops = hops + [[began - arrived, compute_s, float(_nbytes(x))]]
        target = self.target
        self.sender.submit(_nbytes(out),
                           lambda: target.rpc_async(timeout=NO_RPC_TIMEOUT).receive(seq, out, hops, meta)
                           .add_done_callback(_check), on_sent=(lambda _s: self.meter.end()) if measured else None)

    def close(self) -> None:
        self.sender.close()
        self.meter.stop()

    def part(self, images: int, sequences: list[list[int]] | None) -> dict[str, Any]:
        """This stage's energy and memory over the run."""
        return {"resources": self.meter.part(images)}


class _RankSteps(_RankRun):
    """One run of a generation's stage: each batch is a stream's step, its place in the meta."""

    def _build_stage(self) -> None:
        self.gen = GenerationStage(self.builder, self.cfg, self.index)

    def compute(self, seq: int, x: Any, meta: dict | None) -> tuple[Any, float, dict | None]:
        stream, start, step = self.gen.step_of(seq, meta)
        h, compute_s = self.gen.forward(seq, stream, self.gen.stage_input(seq, x, start), start)
        if self.gen.last:  # the token goes back to the master in the meta
            return None, compute_s, {"stream": stream, "token": self.gen.choose(h, stream, step)}
        return self.gen.encode(h), compute_s, dict(meta)

    def part(self, images: int, sequences: list[list[int]] | None) -> dict[str, Any]:
        """Also the generation's part (the last stage's exactness check on ``sequences``, stage 1's token ids)."""
        return {**super().part(images, sequences), "generation": self.gen.part(sequences)}


def _check(fut) -> None:
    try:
        fut.value()
    except Exception as exc:  # the next hop is gone; the master notices by its timeout
        log.error("forwarding failed: %s", exc)


class RankStage:
    """A rank's stage: constructed on the rank by the master, it builds the model once (only its
    own blocks of a language model, for the plan it is given) and is configured for each run."""

    def __init__(self, spec: dict[str, Any], rank: int) -> None:
        s = strict.from_dict(StageSpec, spec, "the master's stage spec")
        self.builder = stage_builder(s.model, num_classes=s.num_classes, weights=s.weights, models_dir=s.models_dir,
                                     device=s.device, model_dir=s.model_dir)
        self.rank = rank
        self.manifest = node_manifest(self.builder.device, role=f"rank{rank}",
                                      weights_fingerprint=self.builder.fingerprint)
        self.run: _RankRun | None = None

    def identity(self) -> dict[str, str]:
        """The model and weights this rank built (the master compares them with its own)."""
        return {"model": self.builder.name, "fingerprint": self.builder.fingerprint}

    def configure(self, config: dict[str, Any], index: int, target: RRef, direction: dict | None) -> dict[str, Any]:
        """Before a run: become stage ``index`` of its plan (re-partitioned in place), send to
        ``target`` over an emulated ``direction`` (if any); returns what this rank built, the
        master's check that it runs the same model, weights and cuts."""
        if self.run is not None:
            self.run.close()
        cfg = RunConfig.from_dict(config, "the master's run configuration")
        self.run = (_RankSteps if cfg.workload.generates else _RankRun)(self.builder, cfg, index, target, direction)
        return {"model": self.builder.name, "fingerprint": self.builder.fingerprint, "cuts": list(cfg.cuts),
                "stage": index, "manifest": {**self.manifest, "role": f"stage{index + 1}",
                                             "energy_sensors": self.run.meter.manifest()}}

    def receive(self, seq: int, x: Activation, hops: list[list[float]], meta: dict | None = None) -> None:
        """One batch (or a generation's step) through this stage, then on to the next."""
        self.run.receive(seq, x, hops, meta)

    def finish(self, images: int, sequences: list[list[int]] | None = None) -> dict[str, Any]:
        """After a run: this stage's energy and memory over it, and a generation's part (the last
        stage's exactness check on ``sequences``, stage 1's token ids)."""
        run, self.run = self.run, None
        run.close()
        return run.part(images, sequences)


class Collector:
    """Where the last stage's results land on the master: each goes to the run in progress
    (``on_result``); one the run cannot use ends it, reported through ``error``."""

    def __init__(self) -> None:
        self.on_result: Callable[[int, float, Any, list[list[float]], dict | None], None] | None = None
        self.error: BaseException | None = None
        self.unblock: Callable[[], None] = lambda: None

    def receive(self, seq: int, result: Any, hops: list[list[float]], meta: dict | None = None) -> None:
        now = time.monotonic()
        try:
            if self.on_result is None:
                raise PeerError(f"a result for batch {seq} arrived outside a run")
            self.on_result(seq, now, result, hops, meta)
        except Exception as exc:
            self.error = exc
            self.unblock()

