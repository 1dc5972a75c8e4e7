"""The RPC master (rank 0): it holds the data (image batches, or a generation's prompts and the
tokens fed back), builds every other rank's stage through a remote reference once per group
(:class:`RankGroup`), configures them before each run and drives the run through the one schedule
(:func:`paretopipe.transport.pipeline.drive`), stamping each result on its own clock."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch
import torch.distributed.rpc as rpc

from ... import records
from ...errors import InfeasibleRun, PeerError, UsageError
from ...manifest import node_manifest
from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink, LinkSender
from ...partition.activation import activation_nbytes, to_host
from ...partition.stages import StageTimer
from ...sysmon import SystemMonitor
from .. import inputs
from ..bookkeeping import BatchBook, measured_images, status_of
from ..endpoint import PromptSource, SourceEndpoint
from ..resources import ResourceMeter, stage_meter
from ..runconfig import RunConfig
from .agent import NO_RPC_TIMEOUT, layout, worker_name
from .rank import Collector, RankStage, StageSpec, _check

log = logging.getLogger("paretopipe.rpc")


class RankGroup:
    """The master's handles on the other ranks: each rank's :class:`RankStage`, built there from
    ``specs`` (rank -> what it builds) once for the group, and the :class:`Collector` the last
    stage returns to."""

    def __init__(self, specs: dict[int, StageSpec], timeout_s: float) -> None:
        self.stages = {rank: rpc.remote(worker_name(rank), RankStage, args=(dataclasses.asdict(spec), rank),
                                        timeout=timeout_s) for rank, spec in specs.items()}
        self.collector = Collector()
        self.collector_ref = rpc.RRef(self.collector)
        self.timeout_s = timeout_s

    def check(self, builder: Any) -> None:
        """Every rank built what the master did (its model and weights), or one line saying which did not."""
        for rank, ref in self.stages.items():
            got = ref.rpc_sync(timeout=self.timeout_s).identity()
            if (got["model"], got["fingerprint"]) != (builder.name, builder.fingerprint):
                raise PeerError(f"{worker_name(rank)} builds {got['model']} ({got['fingerprint']}), the master "
                                f"{builder.name} ({builder.fingerprint}): check torch versions and models/*.pth "
                                f"(paretopipe doctor)")


def _hop_fields(result: Any, hops: list[list[float]], first: int) -> dict[str, Any]:
    """Per-stage durations and the bytes each hop carried; ``first`` is the first stage's number
    among the ranks' hops (stage 1 reports its own when the master computes it)."""
    out: dict[str, Any] = {"hop_bytes": []}
    for i, (queue_s, compute_s, in_bytes) in enumerate(hops, start=first):
        out[f"stage{i}_queue_s"] = queue_s
        out[f"stage{i}_compute_s"] = compute_s
        out["hop_bytes"].append(int(in_bytes))
    out["hop_bytes"].append(0 if result is None else activation_nbytes(result))
    return out


class _MasterSource(SourceEndpoint):
    """The master's endpoint: it computes stage 1 itself when the layout puts it there, and sends
    each batch to the first remote rank through its emulated link; results come back through the
    group's :class:`Collector`."""

    def __init__(self, cfg: RunConfig, builder: Any, book: BatchBook, local: bool, sender: LinkSender,
                 first: Any, collector: Collector, check_alive: Callable[[], None] | None) -> None:
        super().__init__(cfg, builder, book, cfg.timeout_s * cfg.in_flight)
        self.sender, self.first, self.collector = sender, first, collector
        self.local_stage = self._local_stage() if local else None
        self.local = local
        self.check_alive = check_alive
        self.timer = StageTimer(builder.device)

    def check(self) -> None:
        if self.collector.error is not None:
            raise PeerError(f"a result could not be used: {self.collector.error}")
        if self.sender.error is not None:
            raise PeerError(f"sending to the first stage failed: {self.sender.error}")
        if self.check_alive is not None:
            self.check_alive()

    def _local_stage(self) -> torch.nn.Module | None:
        return self.builder.stage(list(self.cfg.cuts), 0)

    def start_fields(self, x: torch.Tensor) -> dict[str, Any]:
        return {"input_bytes": x.numel() * x.element_size()}

    def compute(self, seq: int) -> None:
        if self.local:
            self.x, self.rec["stage1_compute_s"] = self._compute_here(seq)

    def _compute_here(self, seq: int) -> tuple[Any, float]:
        out, compute_s = self.timer.run(self.local_stage, self.x, self.builder.device)
        return to_host(out), compute_s

    def _meta(self, seq: int) -> dict[str, int] | None:
        """What travels with a batch beside its tensor (a generation's step: its place)."""
        return None

    def sequences(self) -> list[list[int]] | None:
        """Stage 1's token ids, which the last rank checks its own against (a generation's)."""
        return None

    def add_stage1_part(self, parts: list[dict[str, Any] | None]) -> None:
        """What stage 1's part of the record holds beyond its resources (a generation's prompts)."""

    def send(self, seq: int) -> None:
        x, first, meta = self.x, self.first, self._meta(seq)
        self.sender.submit(activation_nbytes(x),
                           lambda: first.rpc_async(timeout=NO_RPC_TIMEOUT).receive(seq, x, [], meta)
                           .add_done_callback(_check))


class _MasterPrompts(_MasterSource, PromptSource):
    """The master's endpoint for a generation: stage 1, where the master computes it, is the
    feed's own generation stage (its hidden state encoded as the wire carries it)."""

    def _local_stage(self) -> None:
        return None  # the feed's stage computes it

    def _compute_here(self, seq: int) -> tuple[Any, float]:
        stream, start = self.step
        h, compute_s = self.feed.stage.forward(seq, stream, self.x, start)
        return self.feed.stage.encode(h), compute_s

    def _meta(self, seq: int) -> dict[str, int]:
        return self.feed.meta(seq, self.step[1])

    def sequences(self) -> list[list[int]] | None:
        return self.feed.part().get("sequences")

    def add_stage1_part(self, parts: list[dict[str, Any] | None]) -> None:
        """Stage 1's prompts and tokens beside its blocks' figures (the master's own, or rank 1's)."""
        own = self.feed.stage.part() if self.local else (parts[0] or {}).get("generation") or {}
        parts[0] = {**(parts[0] or {}), "generation": {**self.feed.part(), **own}}


def _configure_ranks(cfg: RunConfig, builder: Any, group: RankGroup, ranks: list[int],
                     conditions: NetworkConditions | None) -> list[dict[str, Any]]:
    """Configure every remote stage rank for ``cfg`` and check that each built what the master did;
    returns what they reported. Raises :class:`PeerError` on a mismatch (nothing ran)."""
    n = len(ranks)
    infos = []
    for j, rank in enumerate(ranks):
        if rank == 0:  # the master computes stage 1 itself
            continue
        target = group.collector_ref if j == n - 1 else group.stages[ranks[j + 1]]
        direction = (conditions.down if j == n - 1 else conditions.up).to_dict() if conditions else None
        infos.append(group.stages[rank].rpc_sync(timeout=cfg.timeout_s).configure(cfg.to_dict(), j, target, direction))
    for info in infos:
        problems = [f"{k}: master {want!r}, {worker_name(ranks[info['stage']])} {info[k]!r}"
                    for k, want in (("model", cfg.model), ("cuts", list(cfg.cuts)), ("fingerprint", builder.fingerprint))
                    if info[k] != want]
        if problems:
            raise PeerError("handshake mismatch: " + "; ".join(problems))
    return infos


def _finish_ranks(group: RankGroup, ranks: list[int], images: int, timeout_s: float,
                  sequences: list[list[int]] | None) -> dict[int, dict[str, Any]]:
    """Each remote rank's part over the run (a rank that is gone has none)."""
    parts: dict[int, dict[str, Any]] = {}
    for j, rank in enumerate(ranks):
        if rank == 0:
            continue
        try:
            parts[j] = group.stages[rank].rpc_sync(timeout=timeout_s).finish(images, sequences)
        except Exception as exc:  # a rank that is gone has no part; the record says so by its absence
            log.warning("no energy and memory from %s: %s", worker_name(rank), str(exc)[:120])
    return parts


def _link_manifest(conditions: NetworkConditions | None, up: EmulatedLink | None,
                   clock_zero: float) -> dict[str, Any]:
    """The record's link: the emulated conditions (and where a trace's replay started and where it
    was at the batch clock's zero), or none."""
    if conditions is None:
        return {"mode": "none"}
    return {"mode": "emulated", "conditions": conditions.to_dict(),
            **({"trace_up": up.manifest(clock_zero=clock_zero)["trace"]} if up and up.trace else {})}


class _Results:
    """The master's side of each result: per-stage durations, each cut's bytes, a generation's
    token, and the output kept where asked."""

    def __init__(self, book: BatchBook, source: _MasterSource, stages: int, keep: bool) -> None:
        self.book, self.source, self.stages, self.keep = book, source, stages, keep
        self.outputs: dict[int, torch.Tensor] = {}

    def __call__(self, seq: int, now: float, result: Any, hops: list[list[float]], meta: dict | None) -> None:
        fields = _hop_fields(result, hops, 2 if self.source.local else 1)
        if self.source.local:
            fields["hop_bytes"].insert(0, self.book.batches[seq]["input_bytes"])
        # The tensor crossing cut j is hop j (hop 0 is the data's way to stage 1).
        cut = fields["hop_bytes"]
        fields["payload_bytes"] = fields["wire_bytes"] = cut[1] if self.stages > 1 else None
        fields.update({f"stage{j}_wire_bytes": cut[j] for j in range(2, self.stages)})
        fields["result_wire_bytes"] = cut[-1]
        fields.update(self.source.result_fields(seq, meta))
        self.book.complete(seq, now, output=result, **fields)
        self.source.result_landed(seq, fields)
        if self.keep and result is not None:
            self.outputs[seq] = result


@dataclasses.dataclass
class _Ran:
    """What one run on the group left: its source (the batches, a generation's feed), its results,
    the master's meter when it was stage 1, how it ended, and the link it ran over."""

    source: _MasterSource
    results: _Results
    meter: ResourceMeter | None
    failure: BaseException | None
    link: dict[str, Any]


def _run_on_group(cfg: RunConfig, builder: Any, group: RankGroup, ranks: list[int],
                  conditions: NetworkConditions | None, keep_outputs: bool,
                  check_alive: Callable[[], None] | None) -> _Ran:
    """Drive one run over the configured group."""
    local = ranks[0] == 0
    book = BatchBook(cfg)
    local_meter = stage_meter(builder, cfg, 0).start() if local else None
    if local_meter is not None:  # the master is stage 1: its window is stage 1's, as on TCP
        book.on_measured_start, book.on_measured_complete = local_meter.begin, local_meter.end
    up = EmulatedLink(conditions.up, seed=cfg.seed) if conditions is not None else None
    sender = LinkSender(up, "rpc-send-master")
    first = group.stages[ranks[1] if local else ranks[0]]
    endpoint = _MasterPrompts if cfg.workload.generates else _MasterSource
    source = endpoint(cfg, builder, book, local, sender, first, group.collector, check_alive)
    results = _Results(book, source, len(ranks), keep_outputs)
    group.collector.error, group.collector.on_result, group.collector.unblock = None, results, book.unblock
    failure: BaseException | None = None
    try:
        source.run()
    except (PeerError, InfeasibleRun, RuntimeError, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        sender.close()
        group.collector.on_result = None
    return _Ran(source, results, local_meter, failure, _link_manifest(conditions, up, book.t0))


def run_master(cfg: RunConfig, builder: Any, group: RankGroup, *, source: str = "master",
               conditions: NetworkConditions | None = None, keep_outputs: bool = False,
               transport: dict | None = None, limits: dict[str, Any] | None = None,
               observed_link: dict[str, Any] | None = None,
               check_alive: Callable[[], None] | None = None) -> tuple[dict[str, Any], list[torch.Tensor] | None]:
    """Configure the stage ranks for ``cfg`` and drive one run from rank 0; returns (record, outputs).
    Raises :class:`PeerError` when a rank built something else (nothing ran); a dead or silent rank
    gives an incomplete record."""
    n = len(cfg.cuts) + 1
    ranks = layout(n, source)
    if cfg.rpc is None or cfg.rpc.world_size is None or cfg.rpc.world_size < max(ranks) + 1:
        raise UsageError(f"world_size {cfg.rpc.world_size if cfg.rpc else None}: {n} stages with the data at the "
                         f"{source} need {max(ranks) + 1} ranks")
    emulated = conditions if conditions is not None and cfg.link_mode == "emulated" else None
    infos = _configure_ranks(cfg, builder, group, ranks, emulated)
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        ran = _run_on_group(cfg, builder, group, ranks, emulated, keep_outputs, check_alive)
    src, local_meter = ran.source, ran.meter
    status, error = status_of(ran.failure)
    images = measured_images(src.book.records(), cfg)
    remote = _finish_ranks(group, ranks, images, cfg.timeout_s, src.sequences())
    parts: list[dict[str, Any] | None] = [remote.get(j) for j in range(n)]
    if local_meter is not None:
        local_meter.stop()
        parts[0] = {"resources": local_meter.part(images)}
    src.add_stage1_part(parts)
    master = node_manifest(builder.device, role="master" if not src.local else "master+stage1",
                           weights_fingerprint=builder.fingerprint, limits=limits)
    manifest = {"stages": [master] + [i["manifest"] for i in infos],
                "link": observed_link or ran.link,
                "rpc": {**(transport or {}), "source": source, "stage_ranks": ranks},
                "inputs": inputs.describe(cfg.dataset, cfg.data_dir)}
    record = records.build_run_record(
        backend="rpc", run_id=records.new_run_id(cfg.model, "-".join(cfg.cuts)), status=status, error=error,
        config=cfg.to_dict(), manifest=manifest, batches=src.book.records(), sysmon={"master": mon.summary()},
        timing={"written_by": "master"}, loadgen=src.harness,
        resources={f"stage{j + 1}": p["resources"] for j, p in enumerate(parts) if p and p.get("resources")})
    src.finish_record(record, parts)
    outputs = ran.results.outputs
    return record, ([outputs[s] for s in sorted(outputs)] if keep_outputs else None)

