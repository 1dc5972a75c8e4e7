"""Pareto-optimal partitions of a model over a chain of N devices, by dynamic programming.

Latency adds up along the chain and the pipelined throughput is set by the busiest resource,
so a partial plan (the first j stages, ending at boundary p) is summarised by the pair
(latency so far, worst busy time so far). Both only grow as stages are added, so a partial
plan that is dominated at (j, p) stays dominated: keeping the Pareto set of pairs per (j, p) is
exact. The cost is O(N * P^2 * front size) instead of the O(P^(N-1)) of enumeration.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from .costmodel import RESULT_META_BYTES, LinkModel, chain_terms
from .profile import RESULT_CODEC, DeviceProfile


@dataclasses.dataclass(frozen=True)
class Plan:
    cuts: tuple[int, ...]            # boundary indices, one per link
    latency_s: float
    bottleneck_s: float
    batch_size: int

    @property
    def throughput_imgs_per_s(self) -> float:
        return self.batch_size / self.bottleneck_s


def _pareto(labels: list[tuple[float, float, tuple[int, ...]]]) -> list[tuple[float, float, tuple[int, ...]]]:
    """Non-dominated (latency, bottleneck) labels, both minimised; exact ties keep one plan."""
    out: list[tuple[float, float, tuple[int, ...]]] = []
    best_b = float("inf")
    for lat, bot, cuts in sorted(labels):
        if bot < best_b:
            out.append((lat, bot, cuts))
            best_b = bot
    return out


class ChainCosts:
    """Per-stage latency and busy contributions, built from the same profile lookups as
    costmodel.chain_terms so the DP and the full model cannot disagree."""

    def __init__(self, profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], batch_size: int,
                 codec: str) -> None:
        self.p, self.links, self.b, self.codec = list(profiles), list(links), batch_size, codec
        self.last = len(profiles[0].boundaries) - 1
        first, final = self.p[0], self.p[-1]
        result_out = final.codec(batch_size, self.last, RESULT_CODEC)
        self.result_decode_s = first.codec(batch_size, self.last, RESULT_CODEC)["decode_s"]
        self.result_bytes = result_out["frame_bytes"] + RESULT_META_BYTES
        self.result_encode_s = result_out["encode_s"]
        self.return_s = sum(link.time_s(self.result_bytes) for link in self.links)
        self.return_busy_s = max(link.busy_s(self.result_bytes) for link in self.links)

    def stage(self, j: int, start: int, stop: int) -> tuple[float, float]:
        """(latency added, worst busy time) of stage j on segments start..stop and its link out."""
        dev = self.p[j]
        compute = dev.stage_compute_s(self.b, start, stop)
        decode = self.result_decode_s if j == 0 else dev.codec(self.b, start, self.codec)["decode_s"]
        if j == len(self.p) - 1:
            work = compute + self.result_encode_s
            lat = work + self.return_s + self.result_decode_s
            return lat, max(self.return_busy_s, decode + work)
        out = dev.codec(self.b, stop, self.codec)
        link = self.links[j]
        nxt = self.p[j + 1].codec(self.b, stop, self.codec)["decode_s"]
        lat = compute + out["encode_s"] + link.time_s(out["frame_bytes"]) + nxt
        work = compute + out["encode_s"] + decode
        if j == 0:
            work += dev.source_s(self.b)
        return lat, max(work, link.busy_s(out["frame_bytes"]))


def pareto_plans(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], batch_size: int,
                 positions: Sequence[int], codec: str = "float32/none") -> list[Plan]:
    """Every Pareto-optimal (latency, throughput) choice of N - 1 cuts from ``positions``
    (boundary indices; stages may be empty), by dynamic programming over the cut sequence."""
    n = len(profiles)
    if n < 2 or len(links) != n - 1:
        raise ValueError(f"{n} devices need at least 2 devices and {n - 1} links, got {len(links)}")
    costs = ChainCosts(profiles, links, batch_size, codec)
    pos = sorted(set(positions) | {0, costs.last})
    # labels[p]: Pareto labels of plans whose stages so far end at boundary p.
    labels: dict[int, list[tuple[float, float, tuple[int, ...]]]] = {0: [(0.0, 0.0, ())]}
    for j in range(n):
        targets = [costs.last] if j == n - 1 else pos
        nxt: dict[int, list[tuple[float, float, tuple[int, ...]]]] = {}
        for start, partial in labels.items():
            for stop in targets:
                if stop < start:
                    continue
                lat, busy = costs.stage(j, start, stop)
                cut = () if j == n - 1 else (stop,)
                nxt.setdefault(stop, []).extend((l0 + lat, max(b0, busy), cuts + cut) for l0, b0, cuts in partial)
        labels = {p: _pareto(ls) for p, ls in nxt.items()}
    return [Plan(cuts, lat, bot, batch_size) for lat, bot, cuts in labels[costs.last]]


def brute_force_plans(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], batch_size: int,
                      positions: Sequence[int], codec: str = "float32/none") -> list[Plan]:
    """The same front by enumerating every cut combination through the full cost model (for tests)."""
    last = len(profiles[0].boundaries) - 1
    pos = sorted(set(positions) | {0, last})
    labels = []
    for cuts in itertools.combinations_with_replacement(pos, len(profiles) - 1):
        terms = chain_terms(profiles, links, list(cuts), batch_size, codec)
        labels.append((terms.latency_s(), terms.bottleneck()[1], tuple(cuts)))
    return [Plan(c, lat, bot, batch_size) for lat, bot, c in _pareto(labels)]


def split_blocks(plan: Plan, profile: DeviceProfile) -> str:
    """The plan as the RPC backend's ``--split-blocks`` list (block indices), or cut names where
    a cut is not at a block boundary."""
    by_boundary = {v: k for k, v in profile.blocks.items()}
    if all(c in by_boundary for c in plan.cuts):
        return ",".join(str(by_boundary[c]) for c in plan.cuts)
    return ",".join(profile.boundaries[c] for c in plan.cuts)
