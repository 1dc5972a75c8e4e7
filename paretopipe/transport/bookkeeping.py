"""The data source's per-batch bookkeeping, shared by both backends (the order of work itself, the
schedule, is ``transport.pipeline``).

A window of ``in_flight`` batches, warm-up flags, start and end stamps on the source's own
monotonic clock (the only clock a latency ever comes from), and the rule that turns an error into
the record's status. The TCP stage 1 and the RPC master both drive one of these.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

from ..errors import InfeasibleRun, PeerError, WireError
from .runconfig import RunConfig

log = logging.getLogger("paretopipe.bookkeeping")
#: An open-ended run's total until it ends (never reached).
OPEN_TOTAL = 1 << 62
#: A run says when its first measured batch is back (the pipeline works end to end), then how far
#: it is at most this often, so a user (or a test) can see it measuring rather than guess.
PROGRESS_EVERY_S = 10.0


class BatchBook:
    """Bookkeeping of one run's batches at the data source."""

    def __init__(self, cfg: RunConfig) -> None:
        # A LoadGen run's batches are as many as LoadGen issues: its total is set at its end.
        self.open_ended = cfg.loadgen is not None
        self.total = OPEN_TOTAL if self.open_ended else cfg.warmup + cfg.num_batches
        self.warmup = cfg.warmup
        self.timeout_s = cfg.timeout_s
        self.max_batch_s = cfg.max_batch_s
        self.window = threading.Semaphore(cfg.in_flight)
        self.batches: dict[int, dict[str, Any]] = {}
        self._starts: dict[int, float] = {}
        self._lock = threading.Lock()
        self.completed = 0
        self.finished = threading.Event()
        self.t0 = time.monotonic()
        self._progress_at = self.t0  # the first measured batch is always reported
        #: Called as a measured batch starts and completes (a stage's energy window: transport.resources).
        self.on_measured_start: Callable[[], None] | None = None
        self.on_measured_complete: Callable[[], None] | None = None
        #: Called with each completed batch's number and output (a LoadGen run answers its samples).
        self.on_complete: Callable[[int, Any], None] | None = None

    def start_clock(self) -> None:
        """Count the batches' times from now (a run whose link starts after its setup)."""
        self.t0 = self._progress_at = time.monotonic()

    def acquire(self, check: Callable[[], None]) -> None:
        """Wait for a free slot in the window, calling ``check`` (which raises on a dead peer)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.window.acquire(timeout=0.05):
            check()
            self.check_deadline()
            if time.monotonic() > deadline:
                raise PeerError(f"no result from the pipeline for {self.timeout_s:g}s (timeout)")
        check()

    def start(self, seq: int, **fields: Any) -> dict[str, Any]:
        """Stamp batch ``seq`` as started now; returns its record for the caller to fill."""
        now = time.monotonic()
        rec = {"seq": seq, "warmup": seq < self.warmup, "start_s": now - self.t0, **fields}
        with self._lock:
            self._starts[seq] = now
            self.batches[seq] = rec
        if seq >= self.warmup and self.on_measured_start is not None:
            self.on_measured_start()
        return rec

    def extend(self) -> None:
        """One batch more than planned (a fault run goes on until the split is whole again)."""
        with self._lock:
            self.total += 1
            if self.completed < self.total:
                self.finished.clear()

    def close_at(self, total: int) -> None:
        """An open-ended run has ended after ``total`` batches: it is finished once they are done."""
        with self._lock:
            self.total = total
            if self.completed >= total:
                self.finished.set()

    def complete(self, seq: int, now: float, output: Any = None, **fields: Any) -> dict[str, Any]:
        """Stamp batch ``seq`` as done at ``now`` (its decoded result ``output`` is usable) and free
        its slot."""
        with self._lock:
            rec = self.batches.get(seq)
            if rec is None or "end_s" in rec:
                raise WireError(f"result for unknown or repeated batch {seq}")
            rec["end_s"] = now - self.t0
            rec["latency_s"] = now - self._starts[seq]
            rec.update(fields)
            del self._starts[seq]
            self.completed += 1
            if self.completed >= self.total:
                self.finished.set()
            measured = self.completed - min(self.completed, self.warmup)
            report = measured > 0 and now >= self._progress_at and self.completed < self.total
            if report:
                self._progress_at = now + PROGRESS_EVERY_S
        self.window.release()
        if self.on_complete is not None:
            self.on_complete(seq, output)
        if seq >= self.warmup and self.on_measured_complete is not None:
            self.on_measured_complete()
        if report and self.open_ended:
            log.info("%d batches measured after %.0f s", measured, now - self.t0)
        elif report:
            log.info("%d of %d batches measured after %.0f s", measured, self.total - self.warmup, now - self.t0)
        return rec

    def check_deadline(self, now: float | None = None) -> None:
        """Raise :class:`InfeasibleRun` once a batch has been in the pipeline longer than
        ``max_batch_s``: completed late, or still outstanding (no need to wait for it to finish)."""
        if self.max_batch_s is None:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            late = [rec for rec in self.batches.values() if rec.get("latency_s", 0.0) > self.max_batch_s]
            oldest = min(self._starts.items(), key=lambda kv: kv[1], default=None)
        if late:
            raise InfeasibleRun(f"batch {late[0]['seq']} took {late[0]['latency_s']:.3g} s, more than --max-batch-s "
                                f"{self.max_batch_s:g}")
        if oldest is not None and now - oldest[1] > self.max_batch_s:
            raise InfeasibleRun(f"batch {oldest[0]} was still in the pipeline after --max-batch-s "
                                f"{self.max_batch_s:g} s")

    def check_stalled(self, now: float | None = None) -> None:
        """Raise :class:`PeerError` when the oldest batch in the pipeline has waited for its result
        longer than the run's timeout."""
        now = time.monotonic() if now is None else now
        with self._lock:
            oldest = min(self._starts.items(), key=lambda kv: kv[1], default=None)
        if oldest is not None and now - oldest[1] > self.timeout_s:
            raise PeerError(f"no result for batch {oldest[0]} from the pipeline for {self.timeout_s:g}s (timeout)")

    def unblock(self) -> None:
        """Wake a source waiting for a slot (its ``check`` then reports why)."""
        self.window.release()

    def wait_finished(self, check: Callable[[], None], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not self.finished.wait(0.05):
            check()
            self.check_deadline()
            if time.monotonic() > deadline:
                raise PeerError("the pipeline never finished the run (timeout)")
        check()
        self.check_deadline()

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(self.batches[s]) for s in sorted(self.batches)]


def measured_images(batches: Sequence[dict[str, Any]], cfg: RunConfig) -> int:
    """The images of a run's measured batches (a LoadGen run's batches vary in size; a fault run
    may serve more batches than planned)."""
    if cfg.loadgen is None and cfg.fault is None:
        return cfg.num_batches * cfg.batch_size
    return sum(b.get("images", cfg.batch_size) for b in batches if not b.get("warmup"))


def status_of(exc: BaseException | None) -> tuple[str, str | None]:
    """The record's ``status`` and one-line ``error`` for how a run ended."""
    if exc is None:
        return "complete", None
    if isinstance(exc, KeyboardInterrupt):
        return "incomplete", "interrupted (Ctrl-C or a termination signal)"
    if isinstance(exc, InfeasibleRun):
        return "infeasible", str(exc)
    text = str(exc).strip().splitlines()
    return "incomplete", (text[0] if text else type(exc).__name__)
