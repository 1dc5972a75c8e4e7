"""The in-process emulated link: what single-machine runs use when tc is unavailable or unwanted.

Each sender owns one per direction. A message is serialised at the direction's rate behind any
message already on the link (so concurrent messages share the rate like a real link), then
arrives one propagation delay (plus jitter) later, never before an earlier message (TCP delivers
in order). Manifests label it ``{"mode": "emulated"}``, never tc. :class:`LinkSchedule` is the
arithmetic alone; the cost model replays it with expected values instead of samples.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from typing import Any, Callable

from . import traces
from .conditions import Direction


class LinkSchedule:
    """FIFO serialisation then delay, in order: the state of one direction of a link."""

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self.busy_until = 0.0
        self.last_arrival = 0.0

    def serialised_by(self, start: float, nbytes: int, lost_segments: float) -> float:
        """When the link has finished sending ``nbytes`` that it began at ``start``."""
        return start + self.direction.serialise_s(nbytes, lost_segments)

    def deliver(self, now: float, nbytes: int, delay_s: float, lost_segments: float = 0.0) -> float:
        start = max(now, self.busy_until)
        self.busy_until = self.serialised_by(start, nbytes, lost_segments)
        arrival = max(self.busy_until + max(0.0, delay_s), self.last_arrival)
        self.last_arrival = arrival
        return arrival


class EmulatedLink:
    """One direction of an emulated link with sampled jitter and loss (seeded, reproducible)."""

    def __init__(self, direction: Direction, seed: int = 0, schedule: LinkSchedule | None = None,
                 which: str = "up") -> None:
        self.direction = direction
        self.trace: traces.Trace | None = None
        self.trace_offset_s: float | None = None
        if schedule is None and direction.trace:
            # A trace replaces the constant rate; the replay starts at a seeded offset, so a rerun
            # with the same seed meets the same stretch of the trace.
            self.trace = traces.load(direction.trace)
            self.trace_offset_s = traces.seeded_offset_s(self.trace, seed, which)
            schedule = traces.TraceSchedule(self.trace, time.monotonic(), self.trace_offset_s)
        self._schedule = schedule or LinkSchedule(direction)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)

    def schedule(self, nbytes: int, now: float | None = None) -> float:
        """The monotonic time at which a message of ``nbytes`` submitted ``now`` has fully arrived."""
        now = time.monotonic() if now is None else now
        d = self.direction
        with self._lock:
            lost = d.sample_lost_segments(nbytes, self._rng)
            return self._schedule.deliver(now, nbytes, d.delay_s + d.sample_jitter(self._rng), lost)

    def trace_time(self, monotonic_s: float) -> float | None:
        """Where the trace's replay is at a monotonic instant (None without a trace)."""
        schedule = self._schedule
        return schedule.trace_time(monotonic_s) if isinstance(schedule, traces.TraceSchedule) else None

    def manifest(self, conditions: Any = None, clock_zero: float | None = None) -> dict[str, Any]:
        """What the link was; with the run's batch-clock zero (monotonic), also the trace's time
        there, which is what puts a batch's ``start_s`` on the trace: the replay starts with the
        link, before the startup probes, so ``offset_s`` alone is early by their duration."""
        out: dict[str, Any] = {"mode": "emulated", "direction": self.direction.to_dict(),
                               "note": "in-process emulation at the sender (serialisation at rate, FIFO, then delay)"}
        if conditions is not None:
            out["conditions"] = conditions.to_dict()
        if self.trace is not None:
            out["trace"] = {**self.trace.describe(), "offset_s": self.trace_offset_s,
                            "replay": "exact: each 1500 bytes leave at the trace's next delivery opportunity"}
            if clock_zero is not None:
                out["trace"]["at_clock_zero_s"] = round(self.trace_time(clock_zero), 6)
        return out


class Outage:
    """A link that carries nothing for a while (``link:down``, :mod:`paretopipe.faults`): what is
    sent in the window leaves when it ends, and what arrives in it is read when it ends, as TCP
    delivers a connection's bytes once a pulled cable is back. Starts up (no outage)."""

    def __init__(self) -> None:
        self.start = self.end = 0.0

    def begin(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds

    def wait(self) -> None:
        """Return once the link is up (at once when it is)."""
        if self.start <= time.monotonic() < self.end:
            sleep_until(self.end)


class LinkSender:
    """Runs send actions in FIFO order on a thread, each when the link says its bytes have arrived.

    Without a link each action runs as soon as the previous one finished. Errors are kept in
    ``error`` for the owner to raise; later actions are dropped.
    """

    def __init__(self, link: EmulatedLink | None, name: str, outage: Outage | None = None) -> None:
        self.link, self.outage = link, outage
        self.error: BaseException | None = None
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, nbytes: int, action: Callable[[], None],
               on_sent: Callable[[float], None] | None = None, shaped: bool = True) -> None:
        if self.error is not None:
            raise self.error
        self._q.put((nbytes, action, time.monotonic(), on_sent, shaped))

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            nbytes, action, submitted, on_sent, shaped = item
            try:
                if self.link is not None and shaped:
                    sleep_until(self.link.schedule(nbytes, now=submitted))
                if self.outage is not None:
                    self.outage.wait()
                action()
                if on_sent is not None:
                    on_sent(time.monotonic() - submitted)
            except BaseException as exc:  # reported to the owner, which ends the run
                self.error = exc
                return

    def close(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)


def sleep_until(deadline: float) -> None:
    """Sleep to a monotonic deadline; the last millisecond spins for accuracy."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(remaining - 0.0005 if remaining > 0.001 else 0)
