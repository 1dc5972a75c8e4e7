"""A language model's device profile: every block's compute in each phase, timed on this device
exactly as a stage runs it: the prefill of a prompt of P tokens, and a decode step of one token
over a KV cache of P tokens and more. ``predict`` adds stages and links from it."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..manifest import node_manifest
from .build import LMSource, build_stage
from .shapes import block_names
from .stage import StageCache
from .prompts import seeded_prompt

PROFILE_KIND = "llm-profile"


@torch.inference_mode()
def _timed_pass(parts, ids: torch.Tensor, start: int, cache: StageCache) -> tuple[list[float], torch.Tensor]:
    """One pass through every block, each timed on its own; returns the times and the logits."""
    times = []
    t0 = time.perf_counter()
    h = parts.embed(ids)
    times.append(time.perf_counter() - t0)
    positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
    rotary = None
    for layer in parts.decoder:
        t0 = time.perf_counter()
        if rotary is None:  # a stage's first layer computes the rotary embedding: counted with it
            rotary = parts.rotary(h, position_ids=positions)
        h = layer(h, attention_mask=None, position_ids=positions, cache=cache, use_cache=True,
                  position_embeddings=rotary)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    h = parts.norm(h)
    times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    logits = parts.lm_head(h[:, -1:, :])
    times.append(time.perf_counter() - t0)
    return times, logits


def profile(src: LMSource, prompt_lens: list[int], decode_steps: int = 16, repetitions: int = 5,
            threads: int | None = None) -> dict[str, Any]:
    """Per prompt length: each block's median prefill time (over ``repetitions`` prefills) and
    median decode time (over ``decode_steps`` steps after a prefill, the context growing)."""
    parts = build_stage(src, [], 0)
    names = block_names(src.shape)
    phases: dict[str, Any] = {}
    for plen in prompt_lens:
        ids = torch.tensor([seeded_prompt(plen, src.shape.vocab_size, 0, 0)])
        _timed_pass(parts, ids, 0, StageCache())  # warm-up: allocations, first-call costs
        prefill = [_timed_pass(parts, ids, 0, StageCache())[0] for _ in range(repetitions)]
        cache = StageCache()
        _, logits = _timed_pass(parts, ids, 0, cache)
        decode = []
        for step in range(decode_steps):
            token = torch.argmax(logits[0, -1]).reshape(1, 1)
            times, logits = _timed_pass(parts, token, plen + step, cache)
            decode.append(times)
        phases[str(plen)] = {
            "prefill_s": [statistics.median(r[b] for r in prefill) for b in range(len(names))],
            "decode_s": [statistics.median(r[b] for r in decode) for b in range(len(names))],
            "decode_context": [plen, plen + decode_steps]}
    return {"kind": PROFILE_KIND, "model": src.name, "identity": src.identity(), "blocks": names,
            "prompt_lens": phases, "repetitions": repetitions, "decode_steps": decode_steps,
            "manifest": node_manifest("cpu", threads or torch.get_num_threads(), role="profile")}
