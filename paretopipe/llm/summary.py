"""A generation's figures from its run record (no torch): time to first token, time per output
token, tokens/s, each stage's compute per phase and KV cache, each hop's bytes, and what a lossy
wire cost against the unsplit model.

A generation's batches are its steps, one token of one stream each, stamped on stage 1's clock
(``start_s`` when stage 1 began the step, ``end_s`` when its token was back). A stream's first
step is its prefill: its latency is the time to first token. Each later token's time per output
token is the gap since the stream's previous token."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import numpy as np

#: The figures a generation's summary adds (besides the per-stage and per-hop ones).
FIGURES = ("streams", "tokens_generated", "ttft_median_s", "ttft_p90_s", "ttft_max_s", "tpot_median_s",
           "tpot_p90_s", "tpot_p99_s", "tokens_per_s", "decode_tokens_per_s", "bytes_per_token", "prefill_bytes",
           "down_bytes_per_token", "round_trips_per_token", "token_agreement", "max_logit_diff", "tpot_bound_s",
           "tpot_over_bound")


def _pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else None


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def token_times(steps: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(times to first token, times per output token) of the measured steps, per stream."""
    by_stream: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        by_stream.setdefault(s["stream"], []).append(s)
    ttft, tpot = [], []
    for items in by_stream.values():
        items.sort(key=lambda s: s["step"])
        if items[0]["step"] == 0:
            ttft.append(items[0]["latency_s"])
        tpot.extend(b["end_s"] - a["end_s"] for a, b in zip(items, items[1:]))
    return ttft, tpot


def cut_bytes(step: dict[str, Any], cut: int) -> float:
    """The bytes a step put across cut ``cut`` (1: stage 1's ``wire_bytes``; a later one: what
    the stage before it sent on, ``stage<cut>_wire_bytes``)."""
    return float((step.get("wire_bytes") if cut == 1 else step.get(f"stage{cut}_wire_bytes")) or 0)


def hop_bytes(steps: Sequence[dict[str, Any]], cuts: int) -> list[tuple[int, float | None]]:
    """Each cut's (prefill bytes over every stream, a decode step's bytes) of the measured steps.
    A decode step's is the median step's: ours are all one size (a compressed one varies a little),
    while llama.cpp's first decode steps after a prompt re-send their graph's buffers (about 130 KB
    once per stream, SmolLM2-135M), which a mean over a short run would spread over every token,
    and which the relay's marks give to the prompt or to the first decode steps by timing alone."""
    out = []
    for cut in range(1, cuts + 1):
        decode = [cut_bytes(s, cut) for s in steps if s["step"] > 0]
        out.append((int(sum(cut_bytes(s, cut) for s in steps if s["step"] == 0)),
                    statistics.median(decode) if decode else None))
    return out


def decode_bound_s(stage_decode_s: Sequence[float], bytes_per_token: float, rtt_s: float,
                   rate_bytes_per_s: float | None) -> float:
    """The least a decode step can take at a cut: every stage's compute, one round trip, and the
    bytes that cross (the hidden state up; the token coming back is a few bytes) at the link's rate."""
    wire_s = bytes_per_token / rate_bytes_per_s if rate_bytes_per_s else 0.0
    return float(sum(stage_decode_s)) + rtt_s + wire_s


def link_terms(link: dict[str, Any]) -> tuple[float, float | None, float | None] | None:
    """A record's link as (round trip: both directions' delays, up and down rates in bytes/s; None
    unlimited), or None where the run applied no conditions it knows."""
    conditions = link.get("conditions") or link.get("conditions_requested") or {}
    if not conditions:
        return None
    up, down = conditions.get("up") or {}, conditions.get("down") or {}

    def rate(direction: dict[str, Any]) -> float | None:
        value = direction.get("rate_mbit_per_s")
        return float(value) * 1e6 / 8 if value else None
    return (float(up.get("delay_ms") or 0) + float(down.get("delay_ms") or 0)) / 1e3, rate(up), rate(down)


def link_figures(link: dict[str, Any]) -> tuple[float, float | None] | None:
    """A record's link as (round trip, up rate in bytes/s; None unlimited): :func:`link_terms`
    without the way back, which a decode step's bound leaves out (a token id)."""
    terms = link_terms(link)
    return None if terms is None else terms[:2]


def bound_figures(out: dict[str, Any], stages: int, link: dict[str, Any]) -> dict[str, Any]:
    """Time per token against its physical bound (:func:`decode_bound_s`), where the link is known."""
    figures = link_figures(link)
    decode = [out.get(f"stage{j}_decode_compute_median_s") for j in range(1, stages + 1)]
    if figures is None or out.get("tpot_median_s") is None or None in decode or out.get("bytes_per_token") is None:
        return {"tpot_bound_s": None, "tpot_over_bound": None}
    bound = decode_bound_s(decode, out["bytes_per_token"], *figures)
    return {"tpot_bound_s": bound, "tpot_over_bound": out["tpot_median_s"] / bound if bound > 0 else None}


def exchange_figures(decode: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """What comes back per decode step and how many round trips a step takes. A peer's steps
    carry the relay's counts (``round_trips``); one of our steps is one exchange by construction
    (a hidden state out, its token back), and what comes back is its result's payload (the token
    id rides in the frame's header: 0 bytes of payload). Medians over the steps, as
    :func:`hop_bytes`'s."""
    if not decode:
        return {"down_bytes_per_token": None, "round_trips_per_token": None}
    return {"down_bytes_per_token": statistics.median(float(s.get("result_wire_bytes") or 0) for s in decode),
            "round_trips_per_token": statistics.median(float(s.get("round_trips", 1)) for s in decode)}


def summarize(batches: Sequence[dict[str, Any]], generation: dict[str, Any],
              link: dict[str, Any] | None = None) -> dict[str, Any]:
    """The generation's summary figures from its batch records, its ``generation`` part and its
    link (the record's manifest's)."""
    steps = [b for b in batches if not b.get("warmup") and b.get("end_s") is not None and "stream" in b]
    ttft, tpot = token_times(steps)
    span = (max(s["end_s"] for s in steps) - min(s["start_s"] for s in steps)) if steps else 0.0
    streams = generation.get("streams") or len(generation.get("prompt_tokens") or []) or \
        len({s["stream"] for s in steps})
    out: dict[str, Any] = {
        "streams": streams, "tokens_generated": len(steps),
        "ttft_median_s": _median(ttft), "ttft_p90_s": _pct(ttft, 90), "ttft_max_s": max(ttft) if ttft else None,
        "tpot_median_s": _median(tpot), "tpot_p90_s": _pct(tpot, 90), "tpot_p99_s": _pct(tpot, 99),
        "tokens_per_s": len(steps) / span if span > 0 else None,
        "decode_tokens_per_s": len(tpot) / sum(tpot) * max(1, streams) if tpot and sum(tpot) > 0 else None,
        # A generation's throughput is in tokens: an image's figure does not apply.
        "throughput_imgs_per_s": None}
    stages = generation.get("stages") or []
    for j, part in enumerate(stages, start=1):
        for phase, prefill in (("prefill", True), ("decode", False)):
            xs = [s[f"stage{j}_compute_s"] for s in steps if (s["step"] == 0) == prefill
                  and s.get(f"stage{j}_compute_s") is not None]
            out[f"stage{j}_{phase}_compute_median_s"] = _median(xs)
        out[f"stage{j}_kv_bytes"] = (part or {}).get("kv_bytes")
    for j, (prefill, per_token) in enumerate(hop_bytes(steps, max(1, len(stages) - 1)), start=1):
        out[f"hop{j}_prefill_bytes"], out[f"hop{j}_bytes_per_token"] = prefill, per_token
    out["bytes_per_token"], out["prefill_bytes"] = out.get("hop1_bytes_per_token"), out.get("hop1_prefill_bytes")
    out.update(exchange_figures([s for s in steps if s["step"] > 0]))
    exact = generation.get("exactness") or {}
    out["token_agreement"] = exact.get("token_agreement")
    out["max_logit_diff"] = exact.get("max_logit_diff")
    out.update(bound_figures(out, len(stages), link or {}))
    return out


def per_token_energy(summary: dict[str, Any]) -> None:
    """A generation's energy per token, in place: each measured step yields one token, so the run's
    energy per measured item (``energy_*per_image_j``, measured or modelled) is its energy per
    token, named so (an image's figure does not apply)."""
    for key in [k for k in summary if "energy" in k and k.endswith("per_image_j")]:
        summary[key.replace("per_image", "per_token")] = summary.pop(key)


def finish_record(record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """A generation's record: its ``generation`` part from the stages' (stage 1's prompts and
    tokens, each stage's blocks and KV cache, the last stage's exactness check) and the figures
    its summary adds (:func:`paretopipe.llm.summary.summarize`)."""
    own = [dict((p or {}).get("generation") or {}) for p in parts]
    first = dict(own[0]) if own else {}
    exactness = next((s.pop("exactness") for s in own if s.get("exactness")), None)
    for s in own:
        for key in ("prompt_tokens", "tokens", "sequences", "streams", "queries", "samples"):
            s.pop(key, None)
    record["generation"] = {"prompt_tokens": first.get("prompt_tokens"), "tokens": first.get("tokens"),
                            "stages": own, "exactness": exactness}
    if first.get("queries") is not None:  # LoadGen's queries, taking the streams' slots in turn
        record["generation"].update({k: first[k] for k in ("streams", "queries", "samples")})
    record["summary"].update(summarize(record["batches"], record["generation"], record["manifest"].get("link")))
    per_token_energy(record["summary"])
    return record
