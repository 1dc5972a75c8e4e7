"""Rate traces: links whose capacity changes over time.

Two formats are read:

- **Mahimahi**: one line per 1500-byte delivery opportunity, the line being its time in integer
  milliseconds from the start; several equal lines are several packets in that millisecond. The
  trace repeats with a period equal to its last timestamp (Mahimahi's rule).
- **CSV**: rows ``time_s,rate_mbit[,delay_ms]`` (a header line and ``#`` comments are allowed).
  Each row's rate (and delay) holds until the next row; the last row holds for as long as the step
  before it, and then the trace repeats. A CSV trace is turned into delivery opportunities spaced
  ``1500 * 8 / rate`` apart, so both formats replay through one schedule.

Replay is exact: a message of ``n`` bytes takes ``ceil(n / 1500)`` delivery opportunities, the first
at or after the time the link is free, and arrives at the last one (plus the propagation delay).
Opportunities that pass while nothing is queued are lost, as on Mahimahi's link. A replay starts at
a seeded offset into the trace (:func:`seeded_offset_s`), recorded in the run's manifest, so a
rerun with the same seed sees the same segment of the trace.

This module is arithmetic and parsing only: the emulated link, the tc controller and the adaptive
split all read the same :class:`Trace`.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import random
from pathlib import Path
from typing import Iterable

from .. import records
from ..errors import UsageError

PACKET_BYTES = 1500
MAX_TRACE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Trace:
    """Delivery opportunities (ms within one period) of one direction, plus an optional delay step
    function (``delay_steps``: (start ms, delay ms) pairs, sorted) from a CSV trace."""

    source: str
    format: str
    opportunities_ms: tuple[float, ...]
    period_ms: float
    delay_steps: tuple[tuple[float, float], ...] = ()

    # -- what a trace holds ------------------------------------------------------------------
    @property
    def period_s(self) -> float:
        return self.period_ms / 1e3

    @property
    def mean_rate_bps(self) -> float:
        return len(self.opportunities_ms) * PACKET_BYTES * 8 / self.period_s

    def opportunity_s(self, index: int) -> float:
        """Time of opportunity ``index`` counted from the start of the first period (repeats)."""
        n = len(self.opportunities_ms)
        cycle, i = divmod(index, n)
        return (cycle * self.period_ms + self.opportunities_ms[i]) / 1e3

    def first_at_or_after(self, t_s: float) -> int:
        """The index of the first opportunity at or after ``t_s`` (seconds from the trace start)."""
        n = len(self.opportunities_ms)
        cycle = math.floor(t_s * 1e3 / self.period_ms)
        within = t_s * 1e3 - cycle * self.period_ms
        i = bisect.bisect_left(self.opportunities_ms, within - 1e-9)
        if i == n:
            cycle, i = cycle + 1, 0
        return cycle * n + i

    def bytes_between(self, t0_s: float, t1_s: float) -> int:
        """Capacity in bytes of the opportunities in ``[t0_s, t1_s)``."""
        return (self.first_at_or_after(t1_s) - self.first_at_or_after(t0_s)) * PACKET_BYTES

    def rate_bps(self, t0_s: float, t1_s: float) -> float:
        """Mean capacity over ``[t0_s, t1_s)`` in bit/s: what the tc controller applies."""
        return self.bytes_between(t0_s, t1_s) * 8 / (t1_s - t0_s)

    def delay_s(self, t_s: float) -> float:
        """The CSV trace's extra delay at ``t_s`` (0 for Mahimahi traces)."""
        if not self.delay_steps:
            return 0.0
        within = (t_s * 1e3) % self.period_ms
        i = bisect.bisect_right([s for s, _ in self.delay_steps], within) - 1
        return self.delay_steps[max(i, 0)][1] / 1e3

    def describe(self) -> dict[str, object]:
        return {"trace": self.source, "format": self.format, "period_s": self.period_s,
                "mean_rate_mbit_per_s": self.mean_rate_bps / 1e6,
                "opportunities_per_period": len(self.opportunities_ms)}


class TraceSchedule:
    """FIFO replay of a trace for one direction: the trace counterpart of ``LinkSchedule``.

    ``origin`` is the monotonic time at which the trace's time ``offset_s`` is reached: trace time
    of a monotonic instant ``t`` is ``t - origin + offset_s``.
    """

    def __init__(self, trace: Trace, origin: float, offset_s: float = 0.0) -> None:
        self.trace, self.origin, self.offset_s = trace, origin, offset_s
        self.next_index = 0           # the first opportunity not yet used
        self.busy_until = origin
        self.last_arrival = 0.0

    def trace_time(self, t: float) -> float:
        return t - self.origin + self.offset_s

    def serialised_by(self, start: float, nbytes: int) -> float:
        """When ``nbytes`` begun at ``start`` have left; takes the opportunities it uses."""
        tr = self.trace
        first = max(tr.first_at_or_after(self.trace_time(start)), self.next_index)
        count = max(1, math.ceil(nbytes / PACKET_BYTES))
        last = first + count - 1
        self.next_index = last + 1
        return tr.opportunity_s(last) - self.offset_s + self.origin

    def deliver(self, now: float, nbytes: int, delay_s: float, lost_segments: float = 0.0) -> float:
        start = max(now, self.busy_until)
        done = self.serialised_by(start, nbytes)
        # A lost segment is sent again one round trip later, on a later opportunity.
        for _ in range(int(lost_segments)):
            done = self.serialised_by(done + 2 * delay_s, PACKET_BYTES)
        self.busy_until = done
        arrival = max(done + max(0.0, delay_s + self.trace.delay_s(self.trace_time(done))), self.last_arrival)
        self.last_arrival = arrival
        return arrival


def seeded_offset_s(trace: Trace, seed: int, direction: str = "up") -> float:
    """Where a replay starts within the trace: seeded, so reruns with the same seed agree. Whole
    milliseconds, so the manifest's number is the offset exactly."""
    rng = random.Random(f"{seed}/{direction}/{trace.source}")
    return rng.randrange(int(trace.period_ms)) / 1e3


# -- reading -------------------------------------------------------------------------------------
def load(path: str | Path) -> Trace:
    """A trace file, Mahimahi or CSV (by its content), checked; cached per path and modification."""
    return _load(*records.small_file_key(path, "trace", MAX_TRACE_BYTES))


@functools.lru_cache(maxsize=16)
def _load(path: str, _mtime_ns: int) -> Trace:
    text = records.read_text_file(path, "trace", "Mahimahi: one millisecond per line; CSV: time_s,rate_mbit")
    lines = [ln.strip() for ln in text.splitlines()]
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    if not body:
        raise UsageError(f"trace {path} is empty")
    if any("," in ln for ln in body[:2]):
        return parse_csv(body, path)
    return parse_mahimahi(body, path)


def parse_mahimahi(lines: Iterable[str], source: str = "<mahimahi>") -> Trace:
    times = []
    for n, ln in enumerate(lines, 1):
        try:
            t = int(ln)
        except ValueError:
            raise UsageError(f"trace {source} line {n}: {ln[:40]!r} is not a whole number of milliseconds "
                             f"(Mahimahi format: one delivery time per line)")
        if t < 0 or (times and t < times[-1]):
            raise UsageError(f"trace {source} line {n}: times must be >= 0 and never decrease")
        times.append(t)
    period = float(times[-1])
    if period <= 0:
        raise UsageError(f"trace {source}: the last time must be > 0 ms (it is the trace's period)")
    # Mahimahi's period ends at the last line, whose opportunity is the next period's first
    # (time 0 again); keep it once.
    opps = tuple(float(t) for t in times if t < period) or (0.0,)
    return Trace(source=source, format="mahimahi", opportunities_ms=opps, period_ms=period)


def parse_csv(lines: list[str], source: str = "<csv>") -> Trace:
    rows: list[tuple[float, float, float | None]] = []
    for n, ln in enumerate(lines, 1):
        cells = [c.strip() for c in ln.split(",")]
        if n == 1 and not records.is_number(cells[0]):
            continue  # header
        if len(cells) not in (2, 3):
            raise UsageError(f"trace {source} line {n}: expected time_s,rate_mbit[,delay_ms], got {ln[:60]!r}")
        try:
            t, rate = float(cells[0]), float(cells[1])
            delay = float(cells[2]) if len(cells) == 3 and cells[2] else None
        except ValueError:
            raise UsageError(f"trace {source} line {n}: {ln[:60]!r} holds a value that is not a number")
        if not (math.isfinite(t) and math.isfinite(rate)) or t < 0 or rate < 0 or (delay is not None and delay < 0):
            raise UsageError(f"trace {source} line {n}: times, rates and delays must be finite and >= 0")
        if rows and t <= rows[-1][0]:
            raise UsageError(f"trace {source} line {n}: times must increase")
        rows.append((t, rate, delay))
    if not rows:
        raise UsageError(f"trace {source} has no rows (time_s,rate_mbit[,delay_ms])")
    if rows[0][0] != 0:
        raise UsageError(f"trace {source}: the first row must be at time 0")
    last_step = rows[-1][0] - rows[-2][0] if len(rows) > 1 else 1.0
    ends = [r[0] for r in rows[1:]] + [rows[-1][0] + last_step]
    # Opportunity k comes when the trace's cumulative capacity reaches k packets: the integral of
    # the replayed trace equals the CSV's exactly, across every change of rate.
    opps: list[float] = []
    packet_bits = PACKET_BYTES * 8
    cum = 0.0
    k = 1
    for (start, rate, _), end in zip(rows, ends):
        bps = rate * 1e6
        cum_end = cum + bps * (end - start)
        while bps > 0 and k * packet_bits <= cum_end + 1e-6:
            opps.append((start + (k * packet_bits - cum) / bps) * 1e3)
            k += 1
        cum = cum_end
    if not opps:
        raise UsageError(f"trace {source}: every rate is 0, so nothing could ever be delivered")
    delays = tuple((r[0] * 1e3, r[2]) for r in rows if r[2] is not None)
    return Trace(source=source, format="csv", opportunities_ms=tuple(opps), period_ms=ends[-1] * 1e3,
                 delay_steps=delays)


# -- the shipped traces --------------------------------------------------------------------------
def shipped_dir() -> Path:
    """The traces generated by ``paretopipe.network.tracegen`` and shipped as package data."""
    from importlib import resources

    return Path(str(resources.files(__package__).joinpath("traces")))
