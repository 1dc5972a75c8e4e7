"""PyTorch RPC backend: an N-stage pipeline over torch.distributed.rpc (TensorPipe).

Rank 0 (``master``) holds the data. Every other rank builds the model itself (no module ever
crosses the network) and, before each run, is *configured* by the master: its stage's cuts, where
to send its output, and its link's direction; it re-partitions in place, so ranks live for a whole
sweep. A batch travels master -> stage 1 -> ... -> last stage, each stage forwarding straight to
the next; the last stage hands the result to the master, which stamps it on its own monotonic clock.

Where the data source sits is a choice (``source``): ``master`` (the anchor's layout: the master
only holds the data, so the input crosses one extra socket before stage 1) or ``stage1`` (the
master computes stage 1 itself, as the TCP backend's stage 1 does; one rank fewer).

Trust: torch.distributed.rpc serialises Python arguments with pickle on its wire. We send only
tensors, numbers, short strings and small lists, but the transport itself must only ever connect
hosts you trust, on a private network. The TCP backend has no such caveat.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed.rpc as rpc

from .. import records
from ..errors import InfeasibleRun, PeerError, UsageError
from ..manifest import node_manifest
from ..network.conditions import Direction, NetworkConditions
from ..network.emulated import EmulatedLink, LinkSender
from ..partition.activation import Activation, activation_nbytes, to_host
from ..partition.stages import StageBuilder, StageTimer
from ..sysmon import SystemMonitor
from . import inputs
from .endpoint import SourceEndpoint
from .resources import ResourceMeter, stage_meter
from .runconfig import RPC_SOURCES, RPC_TRANSPORTS, RunConfig
from .bookkeeping import BatchBook, measured_images, status_of

log = logging.getLogger("paretopipe.rpc")

MASTER = "master"
_STATE: dict[str, Any] = {}


def worker_name(rank: int) -> str:
    return MASTER if rank == 0 else f"worker{rank}"


def backend_options(transport: str, num_threads: int, timeout_s: float, init_method: str):
    """TensorPipe options. ``uv`` forces its TCP transport and the basic channel (so two processes
    on one host still pay for a real socket, and shaping applies); ``auto`` lets it pick shared
    memory. They must be given to the constructor: the C++ agent never reads attributes set later."""
    if transport not in RPC_TRANSPORTS:
        raise UsageError(f"--rpc-transport {transport!r}: valid {', '.join(RPC_TRANSPORTS)}")
    kwargs: dict[str, Any] = {"num_worker_threads": num_threads, "rpc_timeout": timeout_s, "init_method": init_method}
    if transport == "uv":
        kwargs.update(_transports=["uv"], _channels=["basic"])
    return rpc.TensorPipeRpcBackendOptions(**kwargs)


def init(rank: int, world_size: int, master_addr: str, master_port: int, transport: str = "uv",
         num_threads: int = 16, timeout_s: float = 60.0) -> dict[str, Any]:
    """Join the RPC group; returns what was applied, for the manifest."""
    opts = backend_options(transport, num_threads, timeout_s, f"tcp://{master_addr}:{master_port}")
    rpc.init_rpc(worker_name(rank), rank=rank, world_size=world_size, rpc_backend_options=opts)
    return {"transport": "tensorpipe/uv (TCP), channel basic" if transport == "uv" else "tensorpipe/auto",
            "num_worker_threads": num_threads}


def set_builder(builder: StageBuilder, rank: int) -> None:
    """What this rank built; the master may configure it as soon as it has joined."""
    _STATE.update(builder=builder, rank=rank, lock=threading.Lock(), timer=StageTimer(builder.device),
                  manifest=node_manifest(builder.device, role=f"rank{rank}", weights_fingerprint=builder.fingerprint))


# -- a stage rank ---------------------------------------------------------------------------------
def configure(stage_index: int, cuts: list[str], next_name: str, direction: dict[str, Any] | None,
              seed: int, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Called by the master before a run: become stage ``stage_index`` for ``cuts`` (re-partitioned
    in place), send to ``next_name`` over an emulated ``direction`` (if any); returns what this
    rank built, the master's check that it runs the same model, weights and cuts."""
    st = _STATE
    b: StageBuilder = st["builder"]
    old = st.get("sender")
    if old is not None:
        old.close()
    link = EmulatedLink(Direction.from_dict(direction), seed=seed + stage_index) if direction else None
    old_meter = st.get("meter")
    if old_meter is not None:
        old_meter.stop()
    meter = None
    if config is not None:  # this run's energy and memory on this rank (transport.resources)
        cfg = RunConfig.from_dict(config, "the master's run configuration")
        meter = stage_meter(b, cfg, stage_index).start()
    st.update(stage=b.stage(list(cuts), stage_index), index=stage_index, next=next_name, cuts=list(cuts),
              sender=LinkSender(link, f"rpc-send-{stage_index}"), meter=meter,
              warmup=config.get("warmup", 0) if config else 0)
    return {"model": b.name, "fingerprint": b.fingerprint, "cuts": list(cuts), "stage": stage_index,
            "manifest": {**st["manifest"], "role": f"stage{stage_index + 1}",
                         **({"energy_sensors": meter.manifest()} if meter is not None else {})}}


#: Hops carry batches without a timeout of their own (0 is infinite to torch's RPC): a batch on a
#: slow link may take minutes, and the master's deadline, derived from the link
#: (:mod:`paretopipe.network.deadlines`), is the one clock that judges progress; a dead rank is
#: caught by ``check_alive`` and the agent's failure detection.
NO_RPC_TIMEOUT = 0


def resources(images: int) -> dict[str, Any] | None:
    """Called by the master after a run: this rank's energy and memory over it."""
    meter: ResourceMeter | None = _STATE.get("meter")
    if meter is None:
        return None
    meter.stop()
    _STATE["meter"] = None
    return meter.part(images)


def forward(seq: int, x: Activation, hops: list[list[float]]) -> None:
    """Run this stage on ``x`` and pass the output on; ``hops`` collects [queue_s, compute_s, in_bytes]."""
    arrived = time.monotonic()
    st = _STATE
    meter = st.get("meter")
    measured = meter is not None and seq >= st.get("warmup", 0)
    if measured:
        meter.begin()
    with st["lock"]:  # one batch at a time per stage, as in a pipeline
        began = time.monotonic()
        out, compute_s = st["timer"].run(st["stage"], x, st["builder"].device)
    out = to_host(out)
    hops = hops + [[began - arrived, compute_s, float(activation_nbytes(x))]]
    target = st["next"]
    fn = deliver if target == MASTER else forward
    st["sender"].submit(activation_nbytes(out),
                        lambda: rpc.rpc_async(target, fn, args=(seq, out, hops), timeout=NO_RPC_TIMEOUT)
                        .add_done_callback(_check), on_sent=(lambda _s: meter.end()) if measured else None)


def _check(fut) -> None:
    try:
        fut.value()
    except Exception as exc:  # the next hop is gone; the master notices by its timeout
        log.error("forwarding failed: %s", exc)


# -- the master -----------------------------------------------------------------------------------
def deliver(seq: int, result: Activation, hops: list[list[float]]) -> None:
    """Runs on the master when the last stage hands back a result."""
    now = time.monotonic()
    try:
        _STATE["on_result"](seq, now, result, hops)
    except Exception as exc:  # a result the run cannot use ends the run, reported by the master
        _STATE["error"] = exc
        _STATE["book"].unblock()


def _hop_fields(result: Activation, hops: list[list[float]], first: int) -> dict[str, Any]:
    """Per-stage durations and the bytes each hop carried; ``first`` is the first stage's number
    among the ranks' hops (stage 1 reports its own when the master computes it)."""
    out: dict[str, Any] = {"hop_bytes": []}
    for i, (queue_s, compute_s, in_bytes) in enumerate(hops, start=first):
        out[f"stage{i}_queue_s"] = queue_s
        out[f"stage{i}_compute_s"] = compute_s
        out["hop_bytes"].append(int(in_bytes))
    out["hop_bytes"].append(activation_nbytes(result))
    return out


def layout(num_stages: int, source: str) -> list[int]:
    """The rank of each stage (0-based): ``master`` puts stage j on rank j + 1 (the master only
    holds the data); ``stage1`` puts stage j on rank j, the first stage on the master itself."""
    if source not in RPC_SOURCES:
        raise UsageError(f"--rpc-source {source!r}: valid {', '.join(RPC_SOURCES)}")
    return list(range(1, num_stages + 1)) if source == "master" else list(range(num_stages))


def _configure_ranks(cfg: RunConfig, builder: StageBuilder, ranks: list[int],
                     conditions: NetworkConditions | None) -> list[dict[str, Any]]:
    """Configure every remote stage rank for ``cfg`` and check that each built what the master did;
    returns what they reported. Raises :class:`PeerError` on a mismatch (nothing ran)."""
    n = len(ranks)

    def direction(stage: int) -> dict[str, Any] | None:
        if conditions is None:
            return None
        return (conditions.down if stage == n - 1 else conditions.up).to_dict()

    infos = []
    for j, rank in enumerate(ranks):
        if rank == 0:  # the master computes stage 1 itself
            continue
        nxt = MASTER if j == n - 1 else worker_name(ranks[j + 1])
        infos.append(rpc.rpc_sync(worker_name(rank), configure,
                                  args=(j, list(cfg.cuts), nxt, direction(j), cfg.seed, cfg.to_dict()),
                                  timeout=cfg.timeout_s))
    for info in infos:
        problems = [f"{k}: master {want!r}, {worker_name(ranks[info['stage']])} {info[k]!r}"
                    for k, want in (("model", cfg.model), ("cuts", list(cfg.cuts)), ("fingerprint", builder.fingerprint))
                    if info[k] != want]
        if problems:
            raise PeerError("handshake mismatch: " + "; ".join(problems))
    return infos


class _MasterSource(SourceEndpoint):
    """The master's endpoint: it computes stage 1 itself when the layout puts it there, and sends
    each batch to the first remote rank through its emulated link; results come back through
    :func:`deliver`."""

    def __init__(self, cfg: RunConfig, builder: StageBuilder, book: BatchBook, local_stage: Any,
                 sender: LinkSender, first: str, check_alive: Callable[[], None] | None) -> None:
        super().__init__(cfg, builder.input_size, book, cfg.timeout_s * cfg.in_flight)
        self.builder, self.local_stage, self.sender, self.first = builder, local_stage, sender, first
        self.check_alive = check_alive
        self.timer = StageTimer(builder.device)

    def check(self) -> None:
        if _STATE.get("error") is not None:
            raise PeerError(f"a result could not be used: {_STATE['error']}")
        if self.sender.error is not None:
            raise PeerError(f"sending to {self.first} failed: {self.sender.error}")
        if self.check_alive is not None:
            self.check_alive()

    def start_fields(self, x: torch.Tensor) -> dict[str, Any]:
        return {"input_bytes": x.numel() * x.element_size()}

    def compute(self, seq: int) -> None:
        if self.local_stage is not None:
            out, compute_s = self.timer.run(self.local_stage, self.x, self.builder.device)
            self.x = to_host(out)
            self.rec["stage1_compute_s"] = compute_s

    def send(self, seq: int) -> None:
        x, hops, first = self.x, [], self.first
        self.sender.submit(activation_nbytes(x),
                           lambda: rpc.rpc_async(first, forward, args=(seq, x, hops), timeout=NO_RPC_TIMEOUT)
                           .add_done_callback(_check))


def _rank_parts(ranks: list[int], images: int, timeout_s: float) -> dict[str, Any]:
    """Each remote rank's energy and memory over the run (a rank that is gone has none)."""
    parts: dict[str, Any] = {}
    for j, rank in enumerate(ranks):
        if rank == 0:
            continue
        try:
            part = rpc.rpc_sync(worker_name(rank), resources, args=(images,), timeout=timeout_s)
        except Exception as exc:  # a rank that is gone has no part; the record says so by its absence
            log.warning("no energy and memory from %s: %s", worker_name(rank), str(exc)[:120])
            part = None
        if part:
            parts[f"stage{j + 1}"] = part
    return parts


def _link_manifest(conditions: NetworkConditions | None, up: EmulatedLink | None) -> dict[str, Any]:
    """The record's link: the emulated conditions (and where a trace's replay started), or none."""
    if conditions is None:
        return {"mode": "none"}
    return {"mode": "emulated", "conditions": conditions.to_dict(),
            **({"trace_up": up.manifest()["trace"]} if up and up.trace else {})}


def _resource_parts(local_meter: Any, ranks: list[int], cfg: RunConfig, images: int) -> dict[str, Any]:
    """Every stage's energy and memory over ``images``: the master's own when it is stage 1, then the ranks'."""
    parts: dict[str, Any] = {}
    if local_meter is not None:
        local_meter.stop()
        parts["stage1"] = local_meter.part(images)
    parts.update(_rank_parts(ranks, images, cfg.timeout_s))
    return parts


def run_master(cfg: RunConfig, builder: StageBuilder, *, source: str = "master",
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
    emulated = conditions is not None and cfg.link_mode == "emulated"
    infos = _configure_ranks(cfg, builder, ranks, conditions if emulated else None)
    local_stage = builder.stage(list(cfg.cuts), 0) if ranks[0] == 0 else None
    book = BatchBook(cfg)
    local_meter = stage_meter(builder, cfg, 0) if local_stage is not None else None
    if local_meter is not None:  # the master is stage 1: its window is stage 1's, as on TCP
        local_meter.start()
        book.on_measured_start, book.on_measured_complete = local_meter.begin, local_meter.end
    outputs: dict[int, torch.Tensor] = {}
    first_remote = 2 if local_stage is not None else 1

    def on_result(seq: int, now: float, result: torch.Tensor, hops: list[list[float]]) -> None:
        fields = _hop_fields(result, hops, first_remote)
        if local_stage is not None:
            fields["hop_bytes"].insert(0, book.batches[seq]["input_bytes"])
        # The tensor crossing the first cut (stage 1 -> stage 2) is the split's payload.
        fields["payload_bytes"] = fields["wire_bytes"] = fields["hop_bytes"][1] if n > 1 else None
        fields["result_wire_bytes"] = fields["hop_bytes"][-1]
        book.complete(seq, now, output=result, **fields)
        if keep_outputs:
            outputs[seq] = result

    _STATE.update(book=book, on_result=on_result, error=None)
    up = EmulatedLink(conditions.up, seed=cfg.seed) if emulated else None
    sender = LinkSender(up, "rpc-send-master")
    first = worker_name(ranks[1] if local_stage is not None else ranks[0])
    failure: BaseException | None = None
    source_endpoint = _MasterSource(cfg, builder, book, local_stage, sender, first, check_alive)
    with SystemMonitor(gpu=builder.device.startswith("cuda")) as mon:
        try:
            source_endpoint.run()
        except (PeerError, InfeasibleRun, RuntimeError, KeyboardInterrupt) as exc:
            failure = exc
        finally:
            sender.close()
    status, error = status_of(failure)
    parts = _resource_parts(local_meter, ranks, cfg, measured_images(book.records(), cfg))
    master = node_manifest(builder.device, role="master" if local_stage is None else "master+stage1",
                           weights_fingerprint=builder.fingerprint, limits=limits)
    manifest = {"stages": [master] + [i["manifest"] for i in infos],
                "link": observed_link or _link_manifest(conditions if emulated else None, up),
                "rpc": {**(transport or {}), "source": source, "stage_ranks": ranks},
                "inputs": inputs.describe(cfg.dataset, cfg.data_dir)}
    record = records.build_run_record(backend="rpc", run_id=records.new_run_id(cfg.model, "-".join(cfg.cuts)),
                                      status=status, error=error, config=cfg.to_dict(), manifest=manifest,
                                      batches=book.records(), sysmon={"master": mon.summary()},
                                      timing={"written_by": "master"}, resources=parts,
                                      loadgen=source_endpoint.harness)
    return record, ([outputs[s] for s in sorted(outputs)] if keep_outputs else None)
