"""Split language-model runs over torch.distributed.rpc: the master (rank 0) is stage 1 (the
prompts, the embedding, the first layers); rank j runs stage j + 1 and forwards each step
straight to the next rank; the last rank chooses the token and hands it to the master, which
stamps it on its own clock and sends the stream's next step. Every rank builds its own stage
(only its blocks) from the model's name or folder: no module crosses the network.

As for images (``transport.rpc``): RPC pickles its arguments, so connect only trusted hosts."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Any

import torch
import torch.distributed.rpc as rpc

from .. import strict
from ..errors import PeerError, UsageError
from ..llm.build import LMSource
from ..llm.shapes import check_plan
from ..llm.stage import cut_nbytes, decode_cut, encode_cut
from ..llm.summary import summarize
from ..manifest import node_manifest
from ..network.conditions import Direction, NetworkConditions
from ..network.emulated import EmulatedLink, LinkSender
from .rpc import MASTER, NO_RPC_TIMEOUT, worker_name
from .lmrun import LM_RECORD_KIND, LMRunConfig, LMStages, count_hop, hop_figures, new_hop_bytes, stage_part

log = logging.getLogger("paretopipe.rpc")
_LM: dict[str, Any] = {}


def set_source(src: LMSource, rank: int) -> None:
    """What this rank serves; the master configures it once every rank has joined."""
    _LM.update(src=src, stages=LMStages(src), rank=rank, lock=threading.Lock(),
               hop_bytes=new_hop_bytes())


# -- a stage rank -------------------------------------------------------------------------------
def configure(cfg: dict[str, Any], index: int, next_name: str, direction: dict[str, Any] | None) -> dict[str, Any]:
    """Called by the master before a run: become stage ``index`` of the run's plan."""
    src: LMSource = _LM["src"]
    run = strict.from_dict(LMRunConfig, cfg, "the master's run configuration")
    if run.identity != src.identity():
        return {"identity": src.identity(), "model": src.name}
    old = _LM.get("sender")
    if old is not None:
        old.close()
    link = EmulatedLink(Direction.from_dict(direction), seed=run.seed + index) if direction else None
    _LM.update(cfg=run, index=index, next=next_name, stage=_LM["stages"].get(list(run.splits), index),
               sender=LinkSender(link, f"rpc-lm-send-{index}"),
               hop_bytes=new_hop_bytes())
    return {"identity": src.identity(), "model": src.name}


def forward(stream: int, step: int, start: int, tensors: tuple[torch.Tensor, ...]) -> None:
    """One step of one stream through this stage, then on to the next rank (or the master)."""
    st = _LM
    cfg: LMRunConfig = st["cfg"]
    x = decode_cut(tensors)
    with st["lock"]:  # one step at a time per stage, as in a pipeline
        h = st["stage"].forward(stream, x, start)
    target = st["next"]
    if target == MASTER:
        token = cfg.sampling.choose(h[0], stream, step)
        st["sender"].submit(16, lambda: rpc.rpc_async(MASTER, deliver, args=(stream, step, token),
                                                      timeout=NO_RPC_TIMEOUT).add_done_callback(_check))
        return
    out = encode_cut(h, cfg.cut_dtype)
    if stream < cfg.streams:
        count_hop(st["hop_bytes"], start, cut_nbytes(out))
    st["sender"].submit(cut_nbytes(out), lambda: rpc.rpc_async(target, forward, args=(stream, step, start, out),
                                                               timeout=NO_RPC_TIMEOUT).add_done_callback(_check))


def part(threads: int | None) -> dict[str, Any]:
    """Called by the master after a run: this stage's part of the record."""
    st = _LM
    out = stage_part(st["stage"], st["index"], st["cfg"], st["src"],
                      st["hop_bytes"]["prefill"] + st["hop_bytes"]["decode"], threads)
    out["hop_bytes"] = dict(st["hop_bytes"])
    out["manifest"]["role"] = f"rank{st['rank']} stage{st['index'] + 1}"
    return out


def _check(fut) -> None:
    try:
        fut.value()
    except Exception as exc:  # the next hop is gone; the master notices by its timeout
        log.error("forwarding failed: %s", exc)


# -- the master ---------------------------------------------------------------------------------
def deliver(stream: int, step: int, token: int) -> None:
    _LM["results"].put((time.monotonic(), stream, step, token))


def run_master(cfg: LMRunConfig, prompts: list[list[int]], world_size: int, *,
               conditions: NetworkConditions | None, threads: int | None,
               transport: dict[str, Any] | None = None) -> dict[str, Any]:
    """Configure the ranks, generate on every stream, collect the ranks' parts; the record."""
    src: LMSource = _LM["src"]
    check_plan(src.shape, cfg.splits)
    n = len(cfg.splits) + 1
    if world_size != n:
        raise UsageError(f"--world-size {world_size}: a plan of {n} stages has the master as stage 1 and one rank "
                         f"per later stage, {n} ranks")
    for j in range(1, n):
        direction = (conditions.down if j == n - 1 else conditions.up).to_dict() if conditions else None
        got = rpc.rpc_sync(worker_name(j), configure, args=(dataclasses.asdict(cfg), j,
                                                            MASTER if j == n - 1 else worker_name(j + 1), direction),
                           timeout=cfg.timeout_s)
        if got["identity"] != src.identity():
            raise PeerError(f"handshake mismatch: the master has {src.name} ({src.identity()}), {worker_name(j)} has "
                            f"{got['model']} ({got['identity']})")
    stage = _LM["stages"].get(list(cfg.splits), 0)
    _LM["results"] = queue.Queue()
    link = EmulatedLink(conditions.up, seed=cfg.seed) if conditions else None
    sender = LinkSender(link, "rpc-lm-send-master")
    hop_bytes = new_hop_bytes()
    status, error, steps, tokens = "complete", None, [], [[] for _ in range(cfg.streams)]

    def send(stream: int, step: int, ids: list[int], start: int, count: bool) -> float:
        sent = time.monotonic()
        h = stage.forward(stream, torch.tensor([ids]), start)
        out = encode_cut(h, cfg.cut_dtype)
        if count:
            count_hop(hop_bytes, start, cut_nbytes(out))
        sender.submit(cut_nbytes(out), lambda: rpc.rpc_async(worker_name(1), forward, args=(stream, step, start, out),
                                                            timeout=NO_RPC_TIMEOUT).add_done_callback(_check))
        return sent

    def generate(prompts_by_stream: dict[int, list[int]], gen: int, count: bool) -> list[dict[str, Any]]:
        clock, waiting, position = [], {}, {s: len(p) for s, p in prompts_by_stream.items()}
        for s, p in prompts_by_stream.items():
            waiting[(s, 0)] = send(s, 0, p, 0, count)
        while waiting:
            try:
                done, s, step, token = _LM["results"].get(timeout=cfg.timeout_s)
            except queue.Empty:
                raise PeerError(f"no token within {cfg.timeout_s:g}s ({len(waiting)} steps in flight)")
            sent = waiting.pop((s, step), None)
            if sent is None:
                raise PeerError(f"a token for stream {s} step {step}, which is not in flight")
            clock.append({"stream": s, "step": step, "sent_s": sent, "done_s": done, "token": token})
            if s < cfg.streams:
                tokens[s].append(token)
            if step + 1 < gen:
                waiting[(s, step + 1)] = send(s, step + 1, [token], position[s], count)
                position[s] += 1
        return clock

    try:
        for w in range(cfg.warmup):
            generate({cfg.streams + w: prompts[0][:8]}, 2, False)
        steps = generate(dict(enumerate(prompts)), cfg.gen_tokens, True)
    except (PeerError, RuntimeError) as exc:
        status, error = "incomplete", str(exc)
    finally:
        sender.close()
    own = stage_part(stage, 0, cfg, src, hop_bytes["prefill"] + hop_bytes["decode"], threads)
    own["manifest"]["role"] = "master stage1"
    parts = [own]
    if status == "complete":
        parts += [rpc.rpc_sync(worker_name(j), part, args=(threads,), timeout=cfg.timeout_s) for j in range(1, n)]
    hops = hop_figures(parts, hop_bytes, cfg) if status == "complete" else []
    return {"kind": LM_RECORD_KIND, "backend": "rpc", "run_id": f"{src.name}_llm_rpc_s{'-'.join(map(str, cfg.splits))}"
            f"_{time.strftime('%Y%m%d-%H%M%S')}", "status": status, "error": error, "config": dataclasses.asdict(cfg),
            "manifest": {"link": {"mode": "emulated", "conditions": conditions.to_dict()} if conditions else
                         {"mode": "none"}, "rpc": {**(transport or {}), "stage_ranks": list(range(n))},
                         "master": node_manifest("cpu", threads, role="master stage1")},
            "stages": parts, "hops": hops, "steps": steps, "tokens": tokens,
            "summary": summarize(steps, parts, hops, cfg.streams, cfg.power_idle_w, cfg.power_core_w)}
