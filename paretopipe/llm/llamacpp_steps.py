"""A llama.cpp run's steps as our records hold them: one per generated token of each stream, its
interval on the client's clock and what its relays counted since the token before.

llama.cpp's client talks to each RPC server over a connection of its own (a plan of three stages
is a star around stage 1, not a chain), so a run has a relay per server. A step's ``wire_bytes``
is what went up to the first server, ``stage<j+1>_wire_bytes`` what went up to server j (the hop
to stage j+1, as :func:`paretopipe.llm.summary.hop_bytes` reads it), ``result_wire_bytes`` what
came back from all of them to stage 1, and ``round_trips`` the turns of all of them.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from typing import Any, Sequence

from ..network.relay import RelayCounts
from .llamacpp import Streamed


@dataclasses.dataclass
class TokenMarks:
    """Each relay's counts at each token's arrival, in arrival order."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    seen: list[tuple[float, Sequence[RelayCounts]]] = dataclasses.field(default_factory=list)


def _vector(counts: Sequence[RelayCounts]) -> tuple[int, ...]:
    """(up bytes to each server in order, down bytes from all, round trips of all)."""
    return (*(c.up_bytes for c in counts), sum(c.down_bytes for c in counts), sum(c.round_trips for c in counts))


def token_steps(streamed: list[Streamed], marks: TokenMarks, before: Sequence[RelayCounts]) -> list[dict[str, Any]]:
    """The batch records of a run's steps, one per token of each stream, with the relays' counts
    since the mark before. Tokens of several streams that arrive at one mark: the first stream's
    carries its counts."""
    zero = min(s.sent_s for s in streamed)
    last = _vector(before)
    none = (0,) * len(last)
    delta: dict[float, tuple] = {}
    for when, c in sorted(marks.seen, key=lambda m: m[0]):
        now = _vector(c)
        delta[when], last = tuple(a - b for a, b in zip(now, last)), now
    later = [(delta.get(t, none), n, t - p) for s in streamed for (p, _), (t, n) in zip(s.events, s.events[1:])]
    tokens = sum(n for _, n, _ in later) or 1
    mean = tuple(sum(d[i] for d, _, _ in later) / tokens for i in range(len(none)))
    gap = statistics.median([g / n for _, n, g in later for _ in range(n)]) if later else 0.0
    steps: list[dict[str, Any]] = []
    for stream, s in enumerate(streamed):
        shared = _shared(s, delta, gap, mean)
        for step, ((start, end, counts), token) in enumerate(zip(shared, s.tokens)):
            ups = counts[:-2]
            steps.append({"seq": len(steps), "warmup": False, "stream": stream, "step": step, "start_s": start - zero,
                          "end_s": end - zero, "latency_s": end - start, "token": token, "payload_bytes": ups[0],
                          "wire_bytes": ups[0], **{f"stage{j + 1}_wire_bytes": up for j, up in enumerate(ups[1:], 1)},
                          "result_wire_bytes": counts[-2], "round_trips": counts[-1]})
    return steps


def _shared(s: Streamed, delta: dict[float, tuple], gap: float, mean: tuple) -> list[tuple[float, float, tuple]]:
    """Each token's (start, end, counts) of one stream. An event that brought n tokens (held back by
    ``llama-server``) shares its interval and counts evenly among them; the stream's first event
    gives its held tokens the run's median time and mean counts per token, and its prefill the rest."""
    out, start = [], s.sent_s
    for j, (arrival, n) in enumerate(s.events):
        counts = delta.pop(arrival, (0,) * len(mean))
        for i in range(n):
            if j == 0:
                end = max(start, arrival - (n - 1 - i) * gap)
                share = tuple(max(0.0, c - (n - 1) * m) for c, m in zip(counts, mean)) if i == 0 else mean
            else:
                end, share = start + (arrival - start) / (n - i), tuple(c / n for c in counts)
            out.append((start, end, share))
            start = end
    return out


def server_figures(streamed: list[Streamed]) -> dict[str, float | None]:
    """``llama-server``'s own clock: its median prompt time (TTFT without HTTP) and time per token."""
    def median(key: str) -> float | None:
        xs = [float(s.timings[key]) / 1e3 for s in streamed if isinstance(s.timings.get(key), (int, float))]
        return statistics.median(xs) if xs else None
    return {"server_ttft_median_s": median("prompt_ms"), "server_tpot_median_s": median("predicted_per_token_ms")}
