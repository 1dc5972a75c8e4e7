"""Pareto-optimal partitions of a model over a chain of N devices, by dynamic programming.

Latency adds up along the chain and the pipelined throughput is set by the busiest resource,
so a partial plan (the first j stages, ending at boundary p) is summarised by the pair
(latency so far, worst busy time so far). Both only grow as stages are added, so a partial
plan that is dominated at (j, p) stays dominated: keeping the Pareto set of pairs per (j, p) is
exact. The cost is O(N * P^2 * front size) instead of the O(P^(N-1)) of enumeration. Each
stage's contribution comes from the cost model's own pieces, so the two cannot disagree.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from .costmodel import LinkModel, busy_pieces, chain_terms, latency_piece, stage_part
from .device_profile import DeviceProfile

Label = tuple[float, float, tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Plan:
    cuts: tuple[int, ...]            # boundary indices, one per link
    latency_s: float
    bottleneck_s: float
    batch_size: int

    @property
    def throughput_imgs_per_s(self) -> float:
        return self.batch_size / self.bottleneck_s


def _pareto(labels: list[Label]) -> list[Label]:
    """Non-dominated (latency, bottleneck) labels, both minimised; exact ties keep one plan."""
    out: list[Label] = []
    best_b = float("inf")
    for lat, bot, cuts in sorted(labels):
        if bot < best_b:
            out.append((lat, bot, cuts))
            best_b = bot
    return out


class _StageCosts:
    """(latency added, worst busy time) of stage j on boundaries start..stop and its link out."""

    def __init__(self, profiles: Sequence[DeviceProfile], links: Sequence[LinkModel],
                 back_links: Sequence[LinkModel], batch_size: int, codec: str) -> None:
        self.p, self.links, self.b, self.codec = list(profiles), list(links), batch_size, codec
        self.n = len(self.p)
        self.last = len(self.p[0].boundaries) - 1
        # The result's way back and its decode at stage 1 do not depend on where the cuts are.
        result = stage_part(self.p[-1], batch_size, self.n - 1, self.n, self.last, self.last, codec).out_bytes
        first = stage_part(self.p[0], batch_size, 0, self.n, 0, 0, codec)
        self.tail_s = sum(link.time_s(result) for link in back_links) + first.decode_s
        self.return_busy_s = max(link.busy_s(result) for link in back_links)
        self.source_s = self.p[0].source_s(batch_size)

    def __call__(self, j: int, start: int, stop: int) -> tuple[float, float]:
        part = stage_part(self.p[j], self.b, j, self.n, start, stop, self.codec)
        link = self.links[j] if j < self.n - 1 else None
        lat = latency_piece(j, self.n, part, link, self.tail_s)
        busy = max(busy_pieces(j, self.n, part, link, self.source_s).values())
        if j == self.n - 1:
            busy = max(busy, self.return_busy_s)
        return lat, busy


def pareto_plans(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], batch_size: int,
                 positions: Sequence[int], codec: str = "float32/none",
                 back_links: Sequence[LinkModel] | None = None) -> list[Plan]:
    """Every Pareto-optimal (latency, throughput) choice of N - 1 cuts from ``positions``
    (boundary indices; stages may be empty), by dynamic programming over the cut sequence."""
    n = len(profiles)
    if n < 2 or len(links) != n - 1:
        raise ValueError(f"{n} devices need at least 2 devices and {n - 1} links, got {len(links)}")
    costs = _StageCosts(profiles, links, back_links if back_links is not None else links, batch_size, codec)
    pos = sorted(set(positions) | {0, costs.last})
    # labels[p]: Pareto labels of plans whose stages so far end at boundary p.
    labels: dict[int, list[Label]] = {0: [(0.0, 0.0, ())]}
    for j in range(n):
        targets = [costs.last] if j == n - 1 else pos
        nxt: dict[int, list[Label]] = {}
        for start, partial in labels.items():
            for stop in targets:
                if stop < start:
                    continue
                lat, busy = costs(j, start, stop)
                cut = () if j == n - 1 else (stop,)
                nxt.setdefault(stop, []).extend((l0 + lat, max(b0, busy), cuts + cut) for l0, b0, cuts in partial)
        labels = {p: _pareto(ls) for p, ls in nxt.items()}
    return [Plan(cuts, lat, bot, batch_size) for lat, bot, cuts in labels[costs.last]]


def brute_force_plans(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], batch_size: int,
                      positions: Sequence[int], codec: str = "float32/none",
                      back_links: Sequence[LinkModel] | None = None) -> list[Plan]:
    """The same front by enumerating every cut combination through the full cost model."""
    last = len(profiles[0].boundaries) - 1
    pos = sorted(set(positions) | {0, last})
    labels = []
    for cuts in itertools.combinations_with_replacement(pos, len(profiles) - 1):
        terms = chain_terms(profiles, links, list(cuts), batch_size, codec, back_links)
        labels.append((terms.latency_s(), terms.bottleneck()[1], tuple(cuts)))
    return [Plan(c, lat, bot, batch_size) for lat, bot, c in _pareto(labels)]


def split_blocks(plan: Plan, profile: DeviceProfile) -> str:
    """The plan as a ``--split-blocks`` list (block indices), or cut names where a cut is not at
    a block boundary."""
    by_boundary = {v: k for k, v in profile.blocks.items()}
    if all(c in by_boundary for c in plan.cuts):
        return ",".join(str(by_boundary[c]) for c in plan.cuts)
    return ",".join(profile.boundaries[c] for c in plan.cuts)
