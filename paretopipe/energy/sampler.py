"""Energy over a window: a thread reads every sensor at a fixed rate, and the energy of any window
of the samples comes from them afterwards.

A 10 Hz sensor cannot resolve one 20 ms batch, so a run's energy is that of its whole measured
window (N batches): an ``energy`` sensor's counter interpolated at the window's two ends, a
``power`` sensor's readings integrated over it (trapezoids, the ends interpolated). The device's
idle power, measured before a group of runs, is what the stage would draw anyway; the net energy
subtracts it over the window. A sensor that stops answering mid-run keeps its samples up to then,
and a window past that point has no figure, with the reason.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Any, Callable

from .sensors import Sensor, describe

log = logging.getLogger("paretopipe.energy")
DEFAULT_RATE_HZ = 10.0
#: How long the idle power of a device is measured before a group of runs.
IDLE_S = 2.0


class _Trace:
    """One sensor's samples: times and channel readings, and when it stopped answering."""

    def __init__(self, sensor: Sensor) -> None:
        self.sensor = sensor
        self.times: list[float] = []
        self.values: list[dict[str, float]] = []
        self.stopped_at: float | None = None
        self.error: str | None = None

    def sample(self, now: float) -> None:
        if self.stopped_at is not None:
            return
        try:
            value = self.sensor.read()
        except Exception as exc:  # a file gone, a permission change, vcgencmd hung: stop, say why
            self.stopped_at, self.error = now, f"{type(exc).__name__}: {str(exc)[:120]}"
            log.warning("energy sensor %s stopped answering: %s", self.sensor.name, self.error)
            return
        self.times.append(now)
        self.values.append(value)

    def at(self, t: float, channel: str) -> float:
        """The reading at ``t``, linear between the samples around it."""
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return self.values[i][channel]
        lo, hi = max(0, i - 1), min(len(self.times) - 1, i)
        t0, t1 = self.times[lo], self.times[hi]
        v0, v1 = self.values[lo][channel], self.values[hi][channel]
        return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def joules(self, t0: float, t1: float, channel: str) -> float:
        if self.sensor.kind == "energy":
            return self.at(t1, channel) - self.at(t0, channel)
        # Power: trapezoids over the samples inside the window, its ends interpolated.
        inside = [(t, v[channel]) for t, v in zip(self.times, self.values) if t0 < t < t1]
        points = [(t0, self.at(t0, channel))] + inside + [(t1, self.at(t1, channel))]
        return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:]))


class EnergySampler:
    """Reads ``sensors`` every ``1 / rate_hz`` seconds on a thread of its own, from :meth:`start`
    to :meth:`stop`; :meth:`window` gives the energy of any span in between."""

    def __init__(self, sensors: list[Sensor], rate_hz: float = DEFAULT_RATE_HZ,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate_hz > 0:
            raise ValueError(f"sampling rate {rate_hz} Hz: must be positive")
        self.rate_hz, self.clock = rate_hz, clock
        self.traces = [_Trace(s) for s in sensors]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_s = 0.0  # the sampling thread's own CPU time: what measuring costs the stage

    def sample(self) -> None:
        now = self.clock()
        for trace in self.traces:
            trace.sample(now)

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_at = self.clock() + period
        started = time.thread_time()
        while not self._stop.wait(max(0.0, next_at - self.clock())):
            self.sample()
            next_at += period
            self.cpu_s = time.thread_time() - started

    def start(self) -> "EnergySampler":
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="energy-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()

    def __enter__(self) -> "EnergySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Each sensor's joules per channel over [t0, t1] (the clock's times), with the samples
        that fell inside; a sensor whose samples do not span the window has ``joules`` None and
        the reason."""
        out: dict[str, Any] = {}
        for trace in self.traces:
            name = trace.sensor.name
            inside = sum(1 for t in trace.times if t0 <= t <= t1)
            if trace.stopped_at is not None and trace.stopped_at <= t1:
                out[name] = {"joules": None, "samples": inside,
                             "reason": f"stopped answering {trace.stopped_at - t0:+.2f} s into the window "
                                       f"({trace.error})"}
            elif not trace.times or trace.times[0] > t0 or trace.times[-1] < t1:
                out[name] = {"joules": None, "samples": inside, "reason": "its samples do not span the window"}
            else:
                channels = trace.values[0].keys()
                out[name] = {"joules": {c: trace.joules(t0, t1, c) for c in channels}, "samples": inside}
        return out

    def manifest(self) -> list[dict[str, Any]]:
        return [describe(t.sensor) for t in self.traces]


def idle_power(sensors: list[Sensor], seconds: float = IDLE_S, rate_hz: float = DEFAULT_RATE_HZ,
               clock: Callable[[], float] = time.monotonic) -> dict[str, dict[str, float] | None]:
    """Each sensor's mean watts per channel while this process does nothing for ``seconds``."""
    sampler = EnergySampler(sensors, rate_hz, clock)
    with sampler:
        t0 = clock()
        time.sleep(seconds)
        t1 = clock()
    return {name: ({c: j / (t1 - t0) for c, j in w["joules"].items()} if w["joules"] is not None else None)
            for name, w in sampler.window(t0, t1).items()}
