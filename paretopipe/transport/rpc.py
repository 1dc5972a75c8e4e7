"""PyTorch RPC backend: an N-stage pipeline over torch.distributed.rpc (TensorPipe).

Rank 0 (``master``) holds the data; ranks 1..N each build their own stage from the model name,
the cuts and the weights (no module ever crosses the network) and check the weights fingerprint
with the master before any batch moves. A batch travels master -> worker1 -> worker2 -> ... ->
last worker, each worker forwarding straight to the next; the last worker hands the result to the
master, which stamps it on its own monotonic clock. Workers measure their own durations and the
master matches results to batches by sequence number (RPC does not keep order).

Trust: torch.distributed.rpc serialises Python arguments with pickle on its wire. We send only
tensors, integers and small lists of floats, but the transport itself must only ever connect
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
from ..errors import PeerError, UsageError
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions
from ..network.emulated import EmulatedLink, LinkSender
from ..partition.stages import StageBuilder, StageTimer
from ..sysmon import SystemMonitor
from . import inputs
from .runconfig import RunConfig
from .schedule import BatchSchedule, status_of

log = logging.getLogger("paretopipe.rpc")

MASTER = "master"
TRANSPORTS = ("uv", "auto")
_STATE: dict[str, Any] = {}


def worker_name(rank: int) -> str:
    return MASTER if rank == 0 else f"worker{rank}"


def backend_options(transport: str, num_threads: int, timeout_s: float, init_method: str):
    """TensorPipe options. ``uv`` forces its TCP transport and the basic channel (so two processes
    on one host still pay for a real socket, and shaping applies); ``auto`` lets it pick shared
    memory. They must be given to the constructor: the C++ agent never reads attributes set later."""
    if transport not in TRANSPORTS:
        raise UsageError(f"--rpc-transport {transport!r}: valid {', '.join(TRANSPORTS)}")
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


# -- worker side ----------------------------------------------------------------------------------
def setup_worker(builder: StageBuilder, cuts: list[str], stage_index: int, next_name: str,
                 conditions: NetworkConditions | None, seed: int = 0, last: bool = False) -> None:
    """Prepare this process's stage before joining: the master may call in at once. The last
    stage sends results back (the down direction); every other stage sends activations up."""
    direction = None if conditions is None else (conditions.down if last else conditions.up)
    link = EmulatedLink(direction, seed=seed + stage_index) if direction is not None else None
    _STATE.update(builder=builder, stage=builder.stage(cuts, stage_index), index=stage_index,
                  next=next_name, timer=StageTimer(builder.device), lock=threading.Lock(),
                  sender=LinkSender(link, f"rpc-send-{stage_index}"), cuts=list(cuts),
                  manifest=node_manifest(builder.device, role=f"stage{stage_index + 1}",
                                         weights_fingerprint=builder.fingerprint))


def stage_info() -> dict[str, Any]:
    """Called by the master: what this worker built (its handshake)."""
    b = _STATE["builder"]
    return {"model": b.name, "fingerprint": b.fingerprint, "cuts": _STATE["cuts"], "stage": _STATE["index"],
            "manifest": _STATE["manifest"]}


def forward(seq: int, x: torch.Tensor, hops: list[list[float]]) -> None:
    """Run this stage on ``x`` and pass the output on; ``hops`` collects [queue_s, compute_s, in_bytes]."""
    arrived = time.monotonic()
    st = _STATE
    with st["lock"]:  # one batch at a time per stage, as in a pipeline
        began = time.monotonic()
        out, compute_s = st["timer"].run(st["stage"], x, st["builder"].device)
    out = out.detach().cpu().contiguous()
    hops = hops + [[began - arrived, compute_s, float(x.numel() * x.element_size())]]
    target = st["next"]
    fn = deliver if target == MASTER else forward
    st["sender"].submit(out.numel() * out.element_size(),
                        lambda: rpc.rpc_async(target, fn, args=(seq, out, hops)).add_done_callback(_check))


def _check(fut) -> None:
    try:
        fut.value()
    except Exception as exc:  # the next hop is gone; the master notices by its timeout
        log.error("forwarding failed: %s", exc)


# -- master side ----------------------------------------------------------------------------------
def deliver(seq: int, result: torch.Tensor, hops: list[list[float]]) -> None:
    """Runs on the master when the last stage hands back a result."""
    now = time.monotonic()
    try:
        _STATE["on_result"](seq, now, result, hops)
    except Exception as exc:  # a result the run cannot use ends the run, reported by the master
        _STATE["error"] = exc
        _STATE["schedule"].unblock()


def _hop_fields(result: torch.Tensor, hops: list[list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"hop_bytes": []}
    for i, (queue_s, compute_s, in_bytes) in enumerate(hops, start=1):
        out[f"stage{i}_queue_s"] = queue_s
        out[f"stage{i}_compute_s"] = compute_s
        out["hop_bytes"].append(int(in_bytes))
    out["hop_bytes"].append(int(result.numel() * result.element_size()))
    # The tensor crossing the first cut (stage 1 -> stage 2) is the split's payload.
    out["payload_bytes"] = out["wire_bytes"] = out["hop_bytes"][1] if len(hops) > 1 else None
    out["result_wire_bytes"] = out["hop_bytes"][-1]
    return out


def run_master(cfg: RunConfig, world_size: int, num_partitions: int, fingerprint: str,
               conditions: NetworkConditions | None = None, keep_outputs: bool = False,
               transport: dict | None = None,
               check_alive: Callable[[], None] | None = None) -> tuple[dict[str, Any], list[torch.Tensor] | None]:
    """Drive the run from rank 0; returns (record, outputs). Raises :class:`PeerError` when the
    workers built something else (nothing ran); a dead or silent worker gives an incomplete record."""
    stages = [rpc.rpc_sync(worker_name(r), stage_info, timeout=cfg.timeout_s) for r in range(1, num_partitions + 1)]
    for info in stages:
        problems = [f"{k}: master {want!r}, worker{info['stage'] + 1} {info[k]!r}"
                    for k, want in (("model", cfg.model), ("cuts", list(cfg.cuts)), ("fingerprint", fingerprint))
                    if info[k] != want]
        if problems:
            raise PeerError("handshake mismatch: " + "; ".join(problems))
    from ..partition import models

    schedule = BatchSchedule(cfg)
    outputs: dict[int, torch.Tensor] = {}

    def on_result(seq: int, now: float, result: torch.Tensor, hops: list[list[float]]) -> None:
        schedule.complete(seq, now, **_hop_fields(result, hops))
        if keep_outputs:
            outputs[seq] = result

    _STATE.update(schedule=schedule, on_result=on_result, error=None)
    link = EmulatedLink(conditions.up, seed=cfg.seed) if conditions is not None else None
    sender = LinkSender(link, "rpc-send-master")

    def check() -> None:
        if _STATE.get("error") is not None:
            raise PeerError(f"a result could not be used: {_STATE['error']}")
        if sender.error is not None:
            raise PeerError(f"sending to worker1 failed: {sender.error}")
        if check_alive is not None:
            check_alive()

    size = models.input_size(cfg.model)
    failure: BaseException | None = None
    with SystemMonitor() as mon:
        try:
            batches = inputs.batches(cfg.dataset, cfg.batch_size, size, schedule.total, cfg.data_dir, cfg.seed)
            for seq in range(schedule.total):
                x = next(batches)
                schedule.acquire(check)
                schedule.start(seq, input_bytes=x.numel() * x.element_size())
                sender.submit(x.numel() * x.element_size(),
                              lambda s=seq, x=x: rpc.rpc_async(worker_name(1), forward, args=(s, x, []))
                              .add_done_callback(_check))
            schedule.wait_finished(check, cfg.timeout_s * cfg.in_flight)
        except (PeerError, RuntimeError, KeyboardInterrupt) as exc:
            failure = exc
        finally:
            sender.close()
    status, error = status_of(failure)
    manifest = {"stages": [node_manifest(role="master")] + [i["manifest"] for i in stages],
                "link": ({"mode": "emulated", "conditions": conditions.to_dict()} if conditions is not None
                         else {"mode": "none"}), "rpc": transport or {}}
    config = cfg.replace(world_size=world_size, num_partitions=num_partitions).to_dict()
    record = records.build_run_record(backend="rpc", run_id=records.new_run_id(cfg.model, "-".join(cfg.cuts)),
                                      status=status, error=error, config=config, manifest=manifest,
                                      batches=schedule.records(), sysmon={"master": mon.summary()},
                                      timing={"written_by": "master"})
    return record, ([outputs[s] for s in sorted(outputs)] if keep_outputs else None)
