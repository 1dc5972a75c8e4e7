"""A language-model run's figures from its per-token timings (no torch): time to first token,
time per output token, tokens/s, and each stage's compute per phase."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import numpy as np


def _pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else None


def summarize(steps: Sequence[dict[str, Any]], stages: Sequence[dict[str, Any]], hops: Sequence[dict[str, Any]],
              streams: int, power_idle_w: Sequence[float | None] | None = None,
              power_core_w: Sequence[float | None] | None = None) -> dict[str, Any]:
    """``steps``: one per generated token ({stream, step, sent_s, done_s}, seconds on stage 1's
    clock). A stream's first token ends its prefill (time to first token, from the moment stage
    1 began it); each later token's time per output token is the gap since the one before."""
    by_stream: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        by_stream.setdefault(s["stream"], []).append(s)
    ttft, tpot = [], []
    for items in by_stream.values():
        items.sort(key=lambda s: s["step"])
        ttft.append(items[0]["done_s"] - items[0]["sent_s"])
        tpot.extend(b["done_s"] - a["done_s"] for a, b in zip(items, items[1:]))
    span = (max(s["done_s"] for s in steps) - min(s["sent_s"] for s in steps)) if steps else 0.0
    out: dict[str, Any] = {
        "streams": streams, "tokens_generated": len(steps),
        "ttft_median_s": statistics.median(ttft) if ttft else None, "ttft_max_s": max(ttft) if ttft else None,
        "tpot_median_s": statistics.median(tpot) if tpot else None,
        "tpot_p90_s": _pct(tpot, 90), "tpot_p99_s": _pct(tpot, 99),
        "tokens_per_s": len(steps) / span if span > 0 else None,
        "decode_tokens_per_s": (len(tpot) / sum(tpot) * max(1, len(by_stream))) if tpot and sum(tpot) > 0 else None,
    }
    for st in stages:
        j = st["stage"]
        for phase in ("prefill", "decode"):
            xs = st.get(f"compute_{phase}_s") or []
            out[f"stage{j}_{phase}_compute_median_s"] = statistics.median(xs) if xs else None
        out[f"stage{j}_kv_bytes"] = st.get("kv_bytes")
        out[f"stage{j}_peak_rss_bytes"] = st.get("peak_rss_bytes")
    exact = next((st["exactness"] for st in stages if st.get("exactness")), None)
    out["token_agreement"] = exact["token_agreement"] if exact else None
    out["max_logit_diff"] = exact["max_logit_diff"] if exact else None
    out["energy_per_token_modelled_j"] = modelled_energy_per_token(stages, span, len(steps), power_idle_w,
                                                                   power_core_w)
    for hop in hops:
        out[f"hop{hop['hop']}_prefill_bytes"] = hop["prefill_bytes"]
        out[f"hop{hop['hop']}_bytes_per_token"] = hop["bytes_per_token"]
    return out


def modelled_energy_per_token(stages: Sequence[dict[str, Any]], span_s: float, tokens: int,
                              idle_w: Sequence[float | None] | None,
                              core_w: Sequence[float | None] | None) -> float | None:
    """Joules per generated token, modelled as the image runs model it (energy.summary): each
    stage's compute seconds x the power one busy core adds, plus its idle power x the run's span;
    None without declared powers for every stage (this machine has no energy sensor)."""
    if not tokens or not idle_w or not core_w or len(idle_w) != len(stages) or len(core_w) != len(stages) \
            or None in idle_w or None in core_w:
        return None
    joules = 0.0
    for st, idle, core in zip(stages, idle_w, core_w):
        busy = sum(st.get("compute_prefill_s") or []) + sum(st.get("compute_decode_s") or [])
        joules += core * busy + idle * span_s
    return joules / tokens
