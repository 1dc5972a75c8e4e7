"""Following a rate trace with real tc: change the htb class's rate every interval.

tc has no trace replay of its own (Mahimahi does it in user space), so a controller thread steps
the shaped class of an applied tree (``tc.set_rate``) to the trace's mean capacity over each
interval, 100 ms by default. Every step is logged with when it was meant to apply, when the
kernel had it, and the rate, so a run's manifest says what the link really was. A window of the
trace with no delivery opportunity gets ``MIN_RATE_BPS`` (htb cannot hold a zero rate).
"""

from __future__ import annotations

import contextlib
import csv
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from . import tc, traces
from .conditions import Direction

DEFAULT_INTERVAL_S = 0.1
MIN_RATE_BPS = 8_000.0


class TraceController:
    """Steps ``dev``'s shaped class through ``trace`` from ``offset_s``, every ``interval_s``."""

    def __init__(self, trace: traces.Trace, dev: str, runner: tc.Runner, offset_s: float = 0.0,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError("interval must be > 0")
        self.trace, self.dev, self.runner = trace, dev, runner
        self.offset_s, self.interval_s = offset_s, interval_s
        self.log: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = 0.0

    def rate_at_step(self, step: int) -> float:
        t0 = self.offset_s + step * self.interval_s
        return max(MIN_RATE_BPS, self.trace.rate_bps(t0, t0 + self.interval_s))

    def start(self) -> "TraceController":
        self.step(0, time.monotonic())  # the first rate is in place before the block's traffic
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"trace-{self.dev}", daemon=True)
        self._thread.start()
        return self

    def step(self, step: int, due: float) -> None:
        rate = self.rate_at_step(step)
        tc.set_rate(self.dev, rate, self.runner)
        self.log.append({"step": step, "trace_time_s": round(self.offset_s + step * self.interval_s, 6),
                         "rate_bps": rate, "late_s": round(time.monotonic() - due, 6)})

    def _loop(self) -> None:
        step = 1
        try:
            while True:
                due = self.started + step * self.interval_s
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                now = time.monotonic()
                if now - due > self.interval_s:  # fell behind (a slow SSH round trip): skip to now
                    step = int((now - self.started) / self.interval_s)
                    due = self.started + step * self.interval_s
                self.step(step, due)
                step += 1
        except BaseException as exc:  # kept for the owner; the tree stays at the last rate
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def summary(self) -> dict[str, Any]:
        late = sorted(e["late_s"] for e in self.log)
        return {"dev": self.dev, "host": self.runner.where, "trace": self.trace.describe(), "offset_s": self.offset_s,
                "interval_s": self.interval_s, "steps": len(self.log),
                "late_median_s": late[len(late) // 2] if late else None, "late_max_s": late[-1] if late else None,
                "error": None if self.error is None else str(self.error)}

    def write_log(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", "trace_time_s", "rate_bps", "late_s"])
            w.writeheader()
            w.writerows(self.log)
        tmp.replace(path)
        return path


@contextlib.contextmanager
def following(direction: Direction, dev: str, runner: tc.Runner | None = None, offset_s: float | None = None,
               seed: int = 0, which: str = "up", interval_s: float = DEFAULT_INTERVAL_S,
               log_path: Path | None = None) -> Iterator[TraceController | None]:
    """Inside ``tc.applied``: follow ``direction``'s trace on ``dev`` for the block (nothing without
    a trace). The offset is seeded unless given, and recorded in the controller's summary."""
    if not direction.trace:
        yield None
        return
    trace = traces.load(direction.trace)
    start = traces.seeded_offset_s(trace, seed, which) if offset_s is None else offset_s
    ctl = TraceController(trace, dev, runner or tc.Runner(), start, interval_s).start()
    try:
        yield ctl
    finally:
        ctl.stop()
        if log_path is not None:
            ctl.write_log(log_path)
