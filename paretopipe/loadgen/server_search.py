"""The Server scenario's search: the highest Poisson rate whose 99th-percentile latency stays within
the bound, by LoadGen runs at chosen rates.

From a first guess, the rate doubles while runs pass and halves while they fail, until one of
each is known; then the interval between the highest passing and the lowest failing rate is
halved, until it is within ``precision`` of the passing rate or the runs are spent. Every run is
a step of the record. A step passes when LoadGen's own check of the bound holds (its 99th
percentile within the target latency: "performance constraints satisfied") and the pipeline kept
pace with the arrivals (:func:`kept_up`); LoadGen's VALID/INVALID, which also
asks for early stopping and the minimum duration, is kept beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass
class Step:
    """One LoadGen run of the search: the rate asked for, whether the bound held, its figures."""

    target_qps: float
    passed: bool
    figures: dict[str, Any]


#: A step's pipeline kept up when it completed at least this share of the rate LoadGen scheduled,
#: allowing for the last queries' latency (up to the bound) after the last arrival: a queue that
#: grows for the whole run meets any bound on a short enough run, and is not a rate it sustains.
KEEP_UP = 0.9


def passes(figures: dict[str, Any], bound_s: float, token_bounds: tuple[float, float] | None = None) -> bool:
    """The bound held: LoadGen's performance constraint (where it did not log one, the 99th
    percentile itself within the bound; a generation's, its first token's and per token's within
    ``token_bounds``), and the pipeline kept up with the arrivals (``bound_s``: a query's bound)."""
    met = figures.get("loadgen_perf_constraints_met")
    if not isinstance(met, bool):
        held = [("loadgen_latency_p99_s", bound_s)] if token_bounds is None else \
            [("loadgen_ttft_p99_s", token_bounds[0]), ("loadgen_tpot_p99_s", token_bounds[1])]
        met = all(isinstance(figures.get(k), (int, float)) and figures[k] <= b for k, b in held)
    return met and kept_up(figures, bound_s)


def kept_up(figures: dict[str, Any], bound_s: float) -> bool:
    """Completions kept pace with arrivals: over a run of T seconds of arrivals, a stable pipeline
    completes them within T plus the bound, so its completed rate is at least the scheduled one
    times T / (T + bound); this asks for :data:`KEEP_UP` of that (True when LoadGen gave no rates)."""
    done, scheduled = figures.get("loadgen_samples_per_s"), figures.get("loadgen_scheduled_samples_per_s")
    queries = figures.get("loadgen_queries")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (done, scheduled, queries)):
        return True
    span = queries / scheduled
    return done >= KEEP_UP * scheduled * span / (span + bound_s)


def search(measure: Callable[[float], Step], first_qps: float, steps: int, precision: float = 0.04,
           stop: Callable[[], bool] = lambda: False) -> list[Step]:
    """Run up to ``steps`` measurements from ``first_qps``; returns them in order."""
    done: list[Step] = []
    lo, hi = 0.0, None
    rate = first_qps
    for _ in range(steps):
        if stop():
            break
        step = measure(rate)
        done.append(step)
        if step.passed:
            lo = max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:
            rate = rate * 2
        elif lo == 0.0:
            rate = rate / 2
        else:
            if hi - lo <= precision * lo:
                break
            rate = (lo + hi) / 2
    return done


def best(done: list[Step]) -> Step | None:
    """The highest passing step (None when no rate held the bound)."""
    passing = [s for s in done if s.passed]
    return max(passing, key=lambda s: s.target_qps) if passing else None
