"""How a sweep orders, repeats and trusts its runs: seeded interleaved rounds, a precision target
per configuration, and a reference configuration re-measured to catch drift.

A machine drifts while it sweeps (another job, a thermal limit: a Raspberry Pi 4 without a
heatsink falls from 1.5 to 1.0 GHz). Run the splits in order and the drift becomes a bump across
neighbouring splits that reads like a property of the model. So every round runs each unfinished
configuration once, in a seeded random order (recorded), and the rounds repeat: drift spreads
over all splits as noise instead. ``sequential`` keeps the anchor's order: every run of a
configuration back to back, splits in ascending order.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from typing import Any, Hashable, Sequence

from ... import records

ORDERS = ("random", "sequential")
#: Reasons a configuration stopped being measured (summary.csv's ``stop_reason``).
PRECISE, BUDGET, RUNS = "precise", "budget", "runs"


def round_order(configs: Sequence[tuple[str, Any]], seed: int, key: str, round_index: int,
                group_by_network: bool) -> list[tuple[str, Any]]:
    """One round's (network, split) order. With tc shaping the host's qdiscs change per network,
    so a round keeps each network's splits together (networks and splits both shuffled)."""
    rng = random.Random(f"{seed}|{key}|{round_index}")  # str seeds hash stably across processes
    if not group_by_network:
        out = list(configs)
        rng.shuffle(out)
        return out
    networks = list(dict.fromkeys(n for n, _ in configs))
    rng.shuffle(networks)
    out = []
    for network in networks:
        mine = [c for c in configs if c[0] == network]
        rng.shuffle(mine)
        out.extend(mine)
    return out


def relative_halfwidth(values: Sequence[float]) -> float | None:
    """Half the width of the 95% CI of the median (``records.median_ci``), relative to the median."""
    xs = [v for v in values if v is not None and v == v]
    if len(xs) < 2:
        return None
    lo, hi = records.median_ci(xs)
    mid = statistics.median(xs)
    return (hi - lo) / 2 / abs(mid) if mid else None


@dataclasses.dataclass
class ConfigProgress:
    """What one configuration has measured so far and whether it is done."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    throughputs: list[float] = dataclasses.field(default_factory=list)
    attempts: int = 0
    remeasured: int = 0  # runs set aside after drift and measured again (bounded, so drift that
    #                      never ends cannot keep a configuration measuring forever)
    stopped: str | None = None
    halfwidths: tuple[float | None, float | None] = (None, None)

    def add(self, summary: dict[str, Any]) -> None:
        self.latencies.append(summary.get("latency_median_s"))
        self.throughputs.append(records.throughput_of(summary))

    def decide(self, min_runs: int, precision: float | None, max_runs: int) -> str | None:
        """After a round: ``precise`` once both CIs are within ±precision (with at least
        ``min_runs`` runs), ``budget`` when ``max_runs`` attempts are spent, ``runs`` without a
        precision target once ``min_runs`` attempts are made."""
        self.halfwidths = (relative_halfwidth(self.latencies), relative_halfwidth(self.throughputs))
        if precision is None:
            return RUNS if self.attempts >= min_runs else None
        lat, thr = self.halfwidths
        if len(self.latencies) >= min_runs and lat is not None and thr is not None and lat <= precision \
                and thr <= precision:
            return PRECISE
        return BUDGET if self.attempts >= max_runs else None

    def describe(self) -> dict[str, Any]:
        lat, thr = self.halfwidths
        return {"stop_reason": self.stopped, "runs_measured": len(self.latencies), "attempts": self.attempts,
                "remeasured_after_drift": self.remeasured, "latency_ci_halfwidth_rel": lat, "throughput_ci_halfwidth_rel": thr}


@dataclasses.dataclass
class DriftCheck:
    time_s: float
    network: str
    latency_s: float
    throughput: float
    baseline_throughput: float
    change: float | None
    threshold: float | None
    drift: bool
    runs_since: list[str]
    rebaselined: bool = False  # the second check in a row at one new level: the baseline moved there


class DriftMonitor:
    """A reference configuration, re-measured every ``every_s`` seconds. Its first three runs on a
    network set the baseline throughput and the noise (their range relative to the median). A later
    run whose throughput moves by more than ``max(floor, 2 x noise)`` is suspect, and two more runs
    confirm it: when their median of three still moves that far, it is drift, and the runs measured
    since the last good check are to be measured again (one run lands on one moment of a machine
    whose speed swings by 40% from second to second here; each false alarm cost 60-70 runs).
    Throughput, not latency: a slower CPU lowers it directly, while latency with several batches in
    flight is mostly queueing, which swings with the balance of the stages.

    A drift that the next check finds at the same level (within the threshold) is the machine's
    new speed, not a passing swing: the baseline moves there and the runs measured since, at that
    speed, stand. Without that, a baseline caught in a fast moment at the start (this VM ran the
    reference at 62 and then at 36 images/s for minutes) flagged every later check and measured
    the whole sweep twice."""

    BASELINE_RUNS = 3
    CONFIRM_RUNS = 3  # a check that looks like drift is the median of this many runs

    def __init__(self, every_s: float, floor: float = 0.10) -> None:
        self.every_s, self.floor = every_s, floor
        self.baselines: dict[str, tuple[float, float]] = {}
        self.checks: list[DriftCheck] = []
        self.last_check = float("-inf")
        self.since: list[tuple[Hashable, int, str]] = []  # (configuration, run, run key) since the last check
        self._drifted_to: dict[str, float] = {}  # per network: the throughput of a last check that drifted

    @property
    def enabled(self) -> bool:
        return self.every_s > 0

    def due(self, now: float) -> bool:
        return self.enabled and now - self.last_check >= self.every_s

    def needs_baseline(self, network: str) -> bool:
        return self.enabled and network not in self.baselines

    def set_baseline(self, network: str, summaries: Sequence[dict[str, Any]], now: float) -> None:
        thr = sorted(records.throughput_of(s) for s in summaries)
        mid = statistics.median(thr)
        self.baselines[network] = (mid, (thr[-1] - thr[0]) / mid)
        self.last_check = now

    def threshold(self, network: str) -> float:
        return max(self.floor, 2 * self.baselines[network][1])

    def _change(self, network: str, throughput: float) -> float:
        thr0, _ = self.baselines[network]
        return abs(throughput - thr0) / thr0

    def suspect(self, network: str, summary: dict[str, Any]) -> bool:
        """Whether one reference run is off its baseline by more than the threshold (to be confirmed)."""
        return self._change(network, records.throughput_of(summary)) > self.threshold(network)

    def check(self, network: str, summaries: Sequence[dict[str, Any]], now: float) -> DriftCheck:
        """Judge the reference's runs at this check (their median) against the baseline."""
        thr0, noise = self.baselines[network]
        thr = statistics.median(records.throughput_of(s) for s in summaries)
        latency = statistics.median(s["latency_median_s"] for s in summaries)
        change = self._change(network, thr)
        threshold = self.threshold(network)
        drift, rebaselined = change > threshold, False
        before = self._drifted_to.pop(network, None)
        if drift and before is not None and abs(thr - before) / before <= threshold:
            self.baselines[network] = (statistics.median([before, thr]), noise)
            drift, rebaselined = False, True
        elif drift:
            self._drifted_to[network] = thr
        result = DriftCheck(time_s=now, network=network, latency_s=latency, throughput=thr,
                            baseline_throughput=thr0, change=change, threshold=threshold, drift=drift,
                            runs_since=[key for _, _, key in self.since], rebaselined=rebaselined)
        self.checks.append(result)
        self.last_check = now
        self.since = []
        return result
