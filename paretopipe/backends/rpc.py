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
from typing import Any

import torch
import torch.distributed.rpc as rpc

from .. import data, records
from ..errors import PeerError, UsageError
from ..link import EmulatedLink, LinkSender, Profile
from .common import RunConfig, StageBuilder, StageTimer

log = logging.getLogger("paretopipe.rpc")

MASTER = "master"
_STATE: dict[str, Any] = {}


def worker_name(rank: int) -> str:
    return MASTER if rank == 0 else f"worker{rank}"


def init(rank: int, world_size: int, master_addr: str, master_port: int, transport: str = "uv",
         num_threads: int = 16, timeout_s: float = 60.0) -> dict[str, Any]:
    """Join the RPC group. ``uv`` forces TensorPipe's TCP transport (so two processes on one host
    still pay for a real socket and link emulation applies); ``auto`` lets it pick shared memory."""
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=num_threads, rpc_timeout=timeout_s,
                                           init_method=f"tcp://{master_addr}:{master_port}")
    if transport == "uv":
        opts._transports = ["uv"]
        opts._channels = ["basic"]
    elif transport != "auto":
        raise UsageError(f"--rpc-transport {transport!r}: valid uv, auto")
    rpc.init_rpc(worker_name(rank), rank=rank, world_size=world_size, rpc_backend_options=opts)
    return {"transport": "tensorpipe/uv (TCP), channel basic" if transport == "uv" else "tensorpipe/auto",
            "num_worker_threads": num_threads}


# -- worker side ----------------------------------------------------------------------------------
def setup_worker(builder: StageBuilder, cuts: list[str], stage_index: int, next_name: str,
                 profile: Profile | None, seed: int = 0) -> None:
    """Prepare this process's stage before joining: the master may call in at once."""
    link = EmulatedLink(profile, seed=seed + stage_index) if profile is not None else None
    _STATE.update(builder=builder, stage=builder.stage(cuts, stage_index), index=stage_index,
                  next=next_name, timer=StageTimer(builder.device), lock=threading.Lock(),
                  sender=LinkSender(link, f"rpc-send-{stage_index}"), cuts=list(cuts),
                  manifest=records.node_manifest(builder.device, role=f"stage{stage_index + 1}",
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
    with _STATE["cond"]:
        _STATE["results"][seq] = (now, result, hops)
        _STATE["cond"].notify_all()


def run_master(cfg: RunConfig, world_size: int, num_partitions: int, fingerprint: str,
               profile: Profile | None = None, keep_outputs: bool = False, transport: dict | None = None,
               check_alive=None) -> tuple[dict[str, Any], list[torch.Tensor] | None]:
    """Drive the run from rank 0; returns (record, outputs). Raises after building an
    incomplete record if a worker dies or times out (the record is attached to the error)."""
    _STATE.update(results={}, cond=threading.Condition())
    stages = [rpc.rpc_sync(worker_name(r), stage_info, timeout=cfg.timeout_s) for r in range(1, num_partitions + 1)]
    for info in stages:
        problems = [f"{k}: master {want!r}, worker{info['stage'] + 1} {info[k]!r}"
                    for k, want in (("model", cfg.model), ("cuts", list(cfg.cuts)), ("fingerprint", fingerprint))
                    if info[k] != want]
        if problems:
            raise PeerError("handshake mismatch: " + "; ".join(problems))
    from .. import models
    from ..sysmon import SystemMonitor

    size = models.input_size(cfg.model)
    mon = SystemMonitor().__enter__()
    link = EmulatedLink(profile, seed=cfg.seed) if profile is not None else None
    sender = LinkSender(link, "rpc-send-master")
    total = cfg.warmup + cfg.num_batches
    window = threading.Semaphore(cfg.in_flight)
    batches: dict[int, dict[str, Any]] = {}
    outputs: dict[int, torch.Tensor] = {}
    t0 = time.monotonic()
    status, error = "complete", None
    done = 0

    def collect(block_until: int) -> None:
        nonlocal done
        deadline = time.monotonic() + cfg.timeout_s
        with _STATE["cond"]:
            while done < block_until:
                ready = sorted(s for s in _STATE["results"] if "end_s" not in batches[s])
                for s in ready:
                    end, result, hops = _STATE["results"].pop(s)
                    rec = batches[s]
                    rec["end_s"] = end - t0
                    rec["latency_s"] = end - rec.pop("_start")
                    for i, (queue_s, compute_s, in_bytes) in enumerate(hops, start=1):
                        rec[f"stage{i}_queue_s"] = queue_s
                        rec[f"stage{i}_compute_s"] = compute_s
                        rec.setdefault("hop_bytes", []).append(int(in_bytes))
                    rec["hop_bytes"].append(int(result.numel() * result.element_size()))
                    # The tensor crossing the first cut (stage 1 -> stage 2) is the split's payload.
                    rec["payload_bytes"] = rec["wire_bytes"] = rec["hop_bytes"][1] if len(hops) > 1 else None
                    rec["result_wire_bytes"] = rec["hop_bytes"][-1]
                    if keep_outputs:
                        outputs[s] = result
                    done += 1
                    window.release()
                if done >= block_until:
                    return
                if sender.error is not None:
                    raise PeerError(f"sending to worker1 failed: {sender.error}")
                if check_alive is not None:
                    check_alive()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PeerError(f"no result for batch {done} within {cfg.timeout_s:g}s "
                                    f"(a worker died or hangs)")
                _STATE["cond"].wait(min(0.2, remaining))

    try:
        inputs = data.batches("synthetic" if cfg.dataset == "dummy" else cfg.dataset, cfg.batch_size, size,
                              total, cfg.data_dir, cfg.seed)
        for seq in range(total):
            x = next(inputs)
            while not window.acquire(timeout=0.05):
                collect(done + 1)
            start = time.monotonic()
            batches[seq] = {"seq": seq, "warmup": seq < cfg.warmup, "_start": start, "start_s": start - t0,
                            "input_bytes": x.numel() * x.element_size()}
            sender.submit(x.numel() * x.element_size(),
                          lambda s=seq, x=x: rpc.rpc_async(worker_name(1), forward, args=(s, x, [])).add_done_callback(_check))
        collect(total)
    except (PeerError, RuntimeError, KeyboardInterrupt) as exc:
        status = "incomplete"
        error = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc).splitlines()[0]
    finally:
        sender.close()
        mon.stop()
    finished = [{k: v for k, v in batches[s].items() if not k.startswith("_")} for s in sorted(batches)]
    manifest = {"stages": [records.node_manifest(role="master")] + [i["manifest"] for i in stages],
                "link": link.manifest() if link else {"mode": "none"}, "rpc": transport or {}}
    config = cfg.to_dict()
    config.pop("extra", None)
    config.update(cfg.extra, world_size=world_size, num_partitions=num_partitions)
    record = records.build_run_record(backend="rpc", run_id=records.new_run_id(cfg.model, "-".join(cfg.cuts)),
                                      status=status, error=error, config=config, manifest=manifest,
                                      batches=finished, sysmon={"master": mon.summary()}, timing={"written_by": "master"})
    return record, ([outputs[s] for s in sorted(outputs)] if keep_outputs else None)
