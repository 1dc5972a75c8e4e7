"""Predicted time to first token and time per token of every split of a language model, from two
device profiles (``paretopipe profile --model NAME``: each block's compute per phase) and a link;
and of the best plan over a chain of more devices (:func:`best_chain`, which devices to use:
:mod:`paretopipe.predict.subsets`).

For split k, stage 1's blocks come from the first device's profile and the rest from the second's:

- time to first token = stage 1's prefill + the prompt's hidden states across the link (serialised
  at the up rate) + the up delay + stage 2's prefill + the down delay;
- time per token = stage 1's decode + stage 2's decode + the round trip + the bytes per token at
  the up rate (the token coming back is a few bytes).

Both are what the measured records call ``ttft_median_s`` and ``tpot_median_s``; ``validate``
compares them with a sweep's summary. No torch here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from ..llm import shapes
from ..loadgen import queueing
from ..network.conditions import NetworkConditions

PROFILE_KIND = "llm-profile"
RESULT_BYTES = 64  # a RESULT frame carrying one token id: header and meta


def load_profile(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable device profile ({exc})")
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise UsageError(f"{path}: not a language model's device profile (paretopipe profile --model NAME writes one)")
    return data


def _phase(profile: dict[str, Any], prompt_len: int) -> dict[str, Any]:
    """The profile's phases at ``prompt_len``, or at its nearest length with the prefill scaled by
    the ratio of lengths (prefill work grows about linearly with the prompt at these sizes)."""
    lens = {int(k): v for k, v in profile["prompt_lens"].items()}
    if prompt_len in lens:
        return lens[prompt_len]
    near = min(lens, key=lambda p: abs(p - prompt_len))
    scale = prompt_len / near
    return {**lens[near], "prefill_s": [t * scale for t in lens[near]["prefill_s"]], "scaled_from": near}


def predict(shape: shapes.LMShape, profiles: list[dict[str, Any]], conditions: NetworkConditions | None,
            prompt_len: int, cut_dtype: str = "float32") -> list[dict[str, Any]]:
    """One row per split: the predicted time to first token and time per token."""
    if len(profiles) != 2:
        raise UsageError(f"--device-profiles: a language model's split has two devices, got {len(profiles)} profiles "
                         f"(--subsets takes more: which of them to use)")
    a, b = phases_at(shape, profiles, prompt_len)
    up = conditions.up if conditions else None
    down = conditions.down if conditions else None
    rtt = (up.delay_s + down.delay_s) if conditions else 0.0
    rows = []
    for k in range(shape.last_split + 1):
        bpt = shapes.cut_bytes_per_token(shape, k, cut_dtype)
        prefill_bytes = bpt * prompt_len
        s1p, s2p = sum(a["prefill_s"][:k]), sum(b["prefill_s"][k:])
        s1d, s2d = sum(a["decode_s"][:k]), sum(b["decode_s"][k:])
        ttft = s1p + s2p + rtt + (up.serialise_s(prefill_bytes) if up else 0.0) + \
            (down.serialise_s(RESULT_BYTES) if down else 0.0)
        tpot = s1d + s2d + rtt + (up.serialise_s(bpt) if up else 0.0) + (down.serialise_s(RESULT_BYTES) if down else 0.0)
        rows.append({"network": conditions.name if conditions else "unshaped", "split": k, "prompt_len": prompt_len,
                     "predicted_ttft_s": ttft, "predicted_tpot_s": tpot, "stage1_prefill_s": s1p,
                     "stage2_prefill_s": s2p, "stage1_decode_s": s1d, "stage2_decode_s": s2d,
                     "bytes_per_token": bpt})
    return rows


def _hop_s(conditions: NetworkConditions | None, shape: shapes.LMShape, split: int, tokens: int,
           cut_dtype: str) -> float:
    """One hop: forward, its delay and the tokens' bytes at the cut at its rate; back, the token's
    result (a chain's middle stage relays it)."""
    if conditions is None:
        return 0.0
    up, down = conditions.up, conditions.down
    return (up.delay_s + up.serialise_s(shapes.cut_bytes_per_token(shape, split, cut_dtype) * tokens)
            + down.delay_s + down.serialise_s(RESULT_BYTES))


def chain_cost(shape: shapes.LMShape, phases: list[dict[str, Any]], conditions: NetworkConditions | None,
               prompt_len: int, cuts: Sequence[int], objective: str, cut_dtype: str = "float32") -> float:
    """``objective`` (``ttft`` or ``tpot``) of one plan over a chain of devices (``phases``: each
    device's profile at the prompt length, :func:`phases_at`): stage i holds blocks cuts[i-1]..cuts[i],
    every hop crosses ``conditions``' up link and
    the token comes back to stage 1 over its down links, relayed by each stage on the way. Two
    devices give :func:`predict`'s figures."""
    phase, tokens = ("prefill_s", prompt_len) if objective == "ttft" else ("decode_s", 1)
    bounds = [0, *cuts, shape.num_blocks]
    compute = sum(sum(p[phase][bounds[i]:bounds[i + 1]]) for i, p in enumerate(phases))
    return compute + sum(_hop_s(conditions, shape, k, tokens, cut_dtype) for k in cuts)


def best_chain(shape: shapes.LMShape, phases: list[dict[str, Any]], conditions: NetworkConditions | None,
               prompt_len: int, objective: str, cut_dtype: str = "float32") -> tuple[float, tuple[int, ...]]:
    """The least ``objective`` over every plan of the devices in order (cuts increasing in
    0..last_split, as a chain runs them: each device after the first holds a block at least) and
    its cuts, by dynamic programming: both objectives are sums over stages and hops, so the best
    plan whose stage i starts at block c extends the best one of stages before it."""
    if len(phases) - 1 > shape.last_split + 1:
        raise UsageError(f"{len(phases)} devices: {shape.name} has splits 0..{shape.last_split}, so at most "
                         f"{shape.last_split + 2} stages")
    phase, tokens = ("prefill_s", prompt_len) if objective == "ttft" else ("decode_s", 1)
    splits = range(shape.last_split + 1)
    prefix = [[sum(p[phase][:c]) for c in range(shape.num_blocks + 1)] for p in phases]
    hop = {c: _hop_s(conditions, shape, c, tokens, cut_dtype) for c in splits}
    # best[c]: stages before the current one, the current starting at block c (its hop included), and their cuts.
    best = {c: (prefix[0][c] + hop[c], (c,)) for c in splits}
    for i in range(1, len(phases) - 1):
        best = {c: min(((v + prefix[i][c] - prefix[i][a] + hop[c], (*cs, c))
                        for a, (v, cs) in best.items() if a < c), key=lambda t: t[0])
                for c in splits if any(a < c for a in best)}
    last = prefix[-1][shape.num_blocks]
    _, cuts = min(((v + last - prefix[-1][c], cs) for c, (v, cs) in best.items()), key=lambda t: t[0])
    return chain_cost(shape, phases, conditions, prompt_len, cuts, objective, cut_dtype), cuts


def phases_at(shape: shapes.LMShape, profiles: list[dict[str, Any]], prompt_len: int) -> list[dict[str, Any]]:
    """Each profile's phases at ``prompt_len``, every profile checked to be of ``shape``'s model."""
    for p in profiles:
        if p["model"] != shape.name or len(p["blocks"]) != shape.num_blocks:
            raise UsageError(f"a device profile of {p['model']} ({len(p['blocks'])} blocks) cannot predict "
                             f"{shape.name} ({shape.num_blocks} blocks)")
    return [_phase(p, prompt_len) for p in profiles]


def server_columns(row: dict[str, Any], conditions: NetworkConditions | None, gen_tokens: int, streams: int,
                   ttft_bound_s: float, tpot_bound_s: float) -> dict[str, Any]:
    """A split's predicted MLPerf Server rate for queries of one prompt and ``gen_tokens`` tokens:
    the highest Poisson rate whose 99th-percentile time to first token stays within its bound.

    A query keeps each resource busy once per token (stage 1's and stage 2's prefill, then each
    decode step; the prompt's and each token's bytes on the up link) and holds one of ``streams``
    slots for its whole generation; the busiest of these sets the capacity, and a query waits there
    before its first token (:func:`paretopipe.loadgen.queueing.server_bound`). A query's time per
    token does not wait in this model: where even an idle pipeline's exceeds its bound, no rate holds."""
    n = max(1, gen_tokens)
    up = conditions.up if conditions else None
    latency = row["predicted_ttft_s"] + (n - 1) * row["predicted_tpot_s"]
    busy = {"stage1": row["stage1_prefill_s"] + (n - 1) * row["stage1_decode_s"],
            "stage2": row["stage2_prefill_s"] + (n - 1) * row["stage2_decode_s"],
            "link": (up.serialise_s(row["bytes_per_token"] * row["prompt_len"]) +
                     (n - 1) * up.serialise_s(row["bytes_per_token"])) if up else 0.0,
            "streams": latency / max(1, streams)}
    bottleneck = max(busy, key=busy.get)
    bound = queueing.server_bound(busy[bottleneck], row["predicted_ttft_s"], ttft_bound_s)
    qps = bound["predicted_qps"] if row["predicted_tpot_s"] <= tpot_bound_s else 0.0
    return {"predicted_server_qps": qps, "predicted_server_capacity_qps": bound["capacity_qps"],
            "predicted_server_bottleneck": bottleneck, "ttft_bound_s": ttft_bound_s, "tpot_bound_s": tpot_bound_s}


def table(rows: list[dict[str, Any]]) -> str:
    server = any("predicted_server_qps" in r for r in rows)
    out = [f"{'network':>10} {'prompt':>6} {'split':>5} {'TTFT ms':>9} {'TPOT ms':>9} {'B/token':>8}"
           + (f" {'server q/s':>10} {'capacity':>8}  bottleneck" if server else "")]
    for r in rows:
        out.append(f"{r['network']:>10} {r['prompt_len']:>6} {r['split']:>5} {r['predicted_ttft_s'] * 1e3:>9.2f} "
                   f"{r['predicted_tpot_s'] * 1e3:>9.2f} {r['bytes_per_token']:>8}"
                   + (f" {r['predicted_server_qps']:>10.2f} {r['predicted_server_capacity_qps']:>8.2f}  "
                      f"{r['predicted_server_bottleneck']}" if server else ""))
    return "\n".join(out)


def validate(rows: list[dict[str, Any]], measured: Any) -> dict[str, Any]:
    """Predicted against measured, per configuration of a sweep's summary (``Session.configs()``):
    each one's relative errors, and their medians."""
    by_key = {(r["network"], int(r["prompt_len"]), str(r["split"])): r for r in rows}
    pairs = []
    for m in measured.to_dict("records"):
        if m.get("status") != "complete" or m.get("tpot_median_s") != m.get("tpot_median_s"):
            continue
        p = by_key.get((m["network"], int(m.get("prompt_len") or 0), str(m["split_index"])))
        if p is None:
            continue
        pairs.append({"network": m["network"], "prompt_len": int(m["prompt_len"]), "split": p["split"],
                      "ttft_error": p["predicted_ttft_s"] / float(m["ttft_median_s"]) - 1,
                      "tpot_error": p["predicted_tpot_s"] / float(m["tpot_median_s"]) - 1})
    if not pairs:
        raise UsageError("--validate: no configuration of the session matches the predictions (the same model, "
                         "networks and prompt lengths, two stages?)")
    return {"configurations": len(pairs), "pairs": pairs,
            "ttft_median_abs_error": statistics.median(abs(p["ttft_error"]) for p in pairs),
            "tpot_median_abs_error": statistics.median(abs(p["tpot_error"]) for p in pairs)}
