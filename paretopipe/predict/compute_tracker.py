"""Each stage's per-segment compute as a run goes: the estimate the adaptive chooser uses, kept
current while the devices change under it (a Pi that throttles, a server that gets busy).

This is SCIoT's variance detection (Bove and Bedogni, CCNC and SEC 2024) on ParetoPipe's
runtime. Per stage and segment (the compute between two boundaries of the run's self-profile):

- a sliding window of the last ``window`` observed times, and an EMA (weight ``alpha`` on the
  newest), which starts from the profile's time;
- when the window is full and its coefficient of variation exceeds ``cv_threshold``, the segment is
  re-profiled, and so is the next one (its input is this one's output, so a change here shows up
  there too: SCIoT's cascade). Stage 1 re-times both on itself between two batches, on the
  activations it has; on stage 2, which runs every segment it holds on every batch, the
  re-profile restarts the window and the EMA from the batch's own time, a fresh measurement. The
  estimate jumps to the new time instead of drifting there at ``alpha`` a batch;
- every re-profile is an event: when (batch), which stage and segment, why (the CV against the
  threshold), the old estimate and the new.

A stage only observes the segments it runs. What a segment it does not run costs is where the
two policies differ (``speed_ratio``): ours scales the profile's time by the stage's current
speed, observed on the segments it does run (throttling slows every layer alike); SCIoT keeps the
segment's last estimate and refreshes it only when it forces a whole inference onto the device.
The speed is an EMA (in log space, so a slowdown and a recovery are followed alike) of each
batch's observed-over-profiled time, each sample weighted by the compute it spans up to
``PROBE_SPAN_S``. A span shorter than that (or than half the stage's compute, on a model too small
to fill it) is no sample at all: under a 10 ms CPU quota a 2 ms classifier head runs at full
speed on the quota saved while the stage waited, and a sample that is wrong the same way every
batch pulls the estimate there however little it weighs.

Observations and profiles need not share units. With self-profiles (measured by the stages at
the run's start) they do. With ``--device-profiles`` (say, a real Pi's profile while this machine
emulates it), each segment's first full window of observations is its baseline, and the chooser
gets the profile's time scaled by the change since (``relative``). No torch here: the driver
measures, this module keeps the estimates.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from typing import Any, Sequence

#: A compute probe re-times stage 1's first segments up to this much profiled compute: a CPU
#: quota (cpushare's 10 ms period) only shows over a period or more, and a real device's slowdown
#: shows in any span.
PROBE_SPAN_S = 0.02
#: A compute probe is a deliberate, clean sample of a stage's speed: it weighs more in the speed's
#: EMA than a batch does (as a link probe does in the link estimate).
PROBE_WEIGHT = 0.7


@dataclasses.dataclass
class _Segment:
    """One segment on one stage; ``ema_s`` and ``window`` in observed seconds, ``baseline_s`` the
    observed time that means the profile's (None: not known yet)."""

    profiled_s: float
    baseline_s: float | None
    ema_s: float
    window: collections.deque
    seen_seq: int | None = None  # the newest batch that observed (or re-profiled) it

    def estimate(self) -> float:
        """In profile units."""
        if self.baseline_s is None or self.baseline_s <= 0:
            return self.profiled_s
        return self.profiled_s * self.ema_s / self.baseline_s


@dataclasses.dataclass
class Reprofile:
    """A segment to re-time on stage 1 before the next batch, and why (``probe``: a compute probe)."""

    stage: int
    segment: int
    why: str
    probe: bool = False


class ComputeTracker:
    """Per-segment compute estimates of two stages (``profiled[stage][segment]``, seconds)."""

    def __init__(self, profiled: Sequence[Sequence[float]], *, alpha: float = 0.2, cv_threshold: float = 0.15,
                 window: int = 10, speed_ratio: bool = True, relative: bool = False) -> None:
        self.alpha, self.cv_threshold, self.window_len = alpha, cv_threshold, window
        self.speed_ratio, self.relative = speed_ratio, relative
        self.stages = [[_Segment(float(t), None if relative else float(t), float(t), collections.deque(maxlen=window))
                        for t in times] for times in profiled]
        self.latest: list[int | None] = [None] * len(self.stages)  # the newest batch with news of the stage
        # When each stage's speed was last sampled (monotonic s): a stage that runs only short spans
        # (stage 1 at an early split, stage 2 a short tail) gives no sample, so it is probed as if idle.
        self.sampled_at: list[float | None] = [None] * len(self.stages)
        self.speed = [0.0] * len(self.stages)  # log of each stage's time against its profile
        # The shortest span (profiled seconds) that is a sample of a stage's speed: a quota period,
        # or half the stage on a model too small to fill one.
        self.shortest_sample_s = [min(PROBE_SPAN_S, 0.5 * sum(times)) for times in profiled]
        self.events: list[dict[str, Any]] = []
        self.pending: list[Reprofile] = []
        self.reprofiles = 0

    # -- what the stages report ----------------------------------------------------------------
    def observe(self, seq: int, stage: int, first: int, times: Sequence[float]) -> None:
        """Stage ``stage`` ran segments ``first``.. on batch ``seq`` in ``times`` seconds each."""
        segs = self.stages[stage]
        if not times or first < 0 or first + len(times) > len(segs):
            return  # no segment ran there (or not this run's): nothing to learn from it
        flagged: list[tuple[int, float]] = []
        observed = baseline = profiled = 0.0
        for j, t in enumerate(times, first):
            s = segs[j]
            s.window.append(float(t))
            s.seen_seq = seq
            if s.baseline_s is None:
                if len(s.window) == self.window_len:  # the first full window is the baseline
                    s.baseline_s = s.ema_s = statistics.fmean(s.window)
                continue
            s.ema_s = (1 - self.alpha) * s.ema_s + self.alpha * float(t)
            observed, baseline = observed + float(t), baseline + s.baseline_s
            profiled += s.profiled_s
            cv = self._cv(s)
            if cv is not None and cv > self.cv_threshold:
                flagged.append((j, cv))
        self._news(stage, seq)
        self._speed_sample(stage, observed, baseline, profiled)
        for j, cv in flagged:
            why = f"cv {cv:.2f} > {self.cv_threshold:g}"
            for k in (j, j + 1):  # the segment and its successor (SCIoT's cascade)
                if k < len(segs) and all((p.stage, p.segment) != (stage, k) for p in self.pending):
                    self.pending.append(Reprofile(stage, k, why if k == j else f"after segment {j}: {why}"))
        # Stage 2 runs every segment it holds: its re-profile is its newest times, now.
        for p in [p for p in self.pending if p.stage != 0]:
            s = segs[p.segment] if p.stage == stage else None
            if s is not None and s.window:
                self.reprofiled(seq, p.stage, p.segment, [s.window[-1]], [p.why], "stage 2's newest batch")
            self.pending.remove(p)

    def _speed_sample(self, stage: int, observed_s: float, baseline_s: float, profiled_s: float) -> None:
        # Weighting a short span down only slowed the drift: batch after batch of a 5 ms tail on
        # stage 2 (60% of a core) led its speed to a full core's, and the chooser offloaded to it
        # at full speed (tests/controller/test_adaptive.py's throttled test). Stage 1's compute
        # probes and the longer spans carry the speed instead.
        if observed_s <= 0 or baseline_s <= 0 or profiled_s < self.shortest_sample_s[stage]:
            return
        self.sampled_at[stage] = time.monotonic()
        weight = self.alpha * min(1.0, baseline_s / PROBE_SPAN_S)
        self.speed[stage] = (1 - weight) * self.speed[stage] + weight * math.log(observed_s / baseline_s)

    def _news(self, stage: int, seq: int) -> None:
        self.latest[stage] = seq if self.latest[stage] is None else max(self.latest[stage], seq)

    def due(self, probe_after_s: float | None = None) -> list[Reprofile]:
        """Stage-1 segments to re-time before the next batch (handed out once). With
        ``probe_after_s``, a stage 1 whose speed no span sampled for that long re-times its first
        ones: a compute probe, as a link probe refreshes a link the frames no longer show."""
        if probe_after_s is not None and not any(p.stage == 0 for p in self.pending):
            why = f"compute probe: no span of stage 1 sampled its speed for {probe_after_s:g} s"
            self.pending += [Reprofile(0, j, why, probe=True) for j in range(self.probe_due(0, probe_after_s))]
        out = [p for p in self.pending if p.stage == 0]
        self.pending = [p for p in self.pending if p.stage != 0]
        return out

    def probe_due(self, stage: int, after_s: float) -> int:
        """How many of ``stage``'s first segments a compute probe should time now (0: none due):
        those up to ``PROBE_SPAN_S`` of profiled compute, once no span sampled its speed for
        ``after_s`` (it ran none, or only short ones)."""
        seen = self.sampled_at[stage]
        if seen is not None and time.monotonic() - seen < after_s:
            return 0
        self.sampled_at[stage] = time.monotonic()  # one probe per interval, answered or not
        span = 0.0
        for j, s in enumerate(self.stages[stage]):
            span += s.profiled_s
            if span >= PROBE_SPAN_S:
                return j + 1
        return len(self.stages[stage])

    def reprofiled(self, seq: int, stage: int, first: int, times: Sequence[float], whys: Sequence[str],
                   how: str = "re-timed on stage 1", probe: bool = False) -> None:
        """Fresh times (observed seconds) of segments ``first``.. of ``stage``: each one's window
        and EMA restart from its time (a segment with no baseline yet takes it as its baseline), the
        stage's speed takes one sample over them (a probe's weighs ``PROBE_WEIGHT``), and an event
        per segment is kept."""
        segs = self.stages[stage]
        if first < 0 or first + len(times) > len(segs) or not times:
            return
        observed = baseline = profiled = 0.0
        for j, (seconds, why) in enumerate(zip(times, whys), first):
            s = segs[j]
            old = self.estimate(stage, j)
            s.window.clear()
            s.window.append(float(seconds))
            s.ema_s = float(seconds)
            s.seen_seq = seq
            if s.baseline_s is None:
                s.baseline_s = float(seconds)
            observed, baseline = observed + float(seconds), baseline + s.baseline_s
            profiled += s.profiled_s
            self.reprofiles += 1
            self.events.append({"seq": seq, "stage": f"stage{stage + 1}", "segment": j, "why": why, "how": how,
                                "old_s": round(old, 7), "new_s": round(s.estimate(), 7)})
        self._news(stage, seq)
        if probe:
            if observed > 0 and baseline > 0:
                self.sampled_at[stage] = time.monotonic()
                self.speed[stage] = (1 - PROBE_WEIGHT) * self.speed[stage] + PROBE_WEIGHT * math.log(observed / baseline)
        else:
            self._speed_sample(stage, observed, baseline, profiled)

    # -- what the chooser uses ------------------------------------------------------------------
    def estimate(self, stage: int, segment: int) -> float:
        """Segment ``segment``'s compute on ``stage`` as the chooser takes it (profile units)."""
        s = self.stages[stage][segment]
        if not self.speed_ratio or self._current(stage, segment):
            return s.estimate()
        return s.profiled_s * self.ratio(stage)

    def estimates(self, stage: int) -> list[float]:
        return [self.estimate(stage, j) for j in range(len(self.stages[stage]))]

    def ratio(self, stage: int) -> float:
        """The stage's time now against its profile (1 before any news of it)."""
        return math.exp(self.speed[stage])

    def _current(self, stage: int, segment: int) -> bool:
        """The segment's estimate is from the stage's newest news (its batch, or a re-profile)."""
        latest = self.latest[stage]
        s = self.stages[stage][segment]
        return latest is not None and s.seen_seq is not None and s.seen_seq >= latest and s.baseline_s is not None

    def _cv(self, s: _Segment) -> float | None:
        # Over a full window only: a re-profiled segment's window restarts, so it is not flagged
        # again before ``window`` new batches have shown whether the change holds.
        if len(s.window) < self.window_len:
            return None
        mean = statistics.fmean(s.window)
        return statistics.pstdev(s.window) / mean if mean > 0 else None

    def summary(self) -> dict[str, Any]:
        return {"reprofiles": self.reprofiles, "speed_ratio": self.speed_ratio, "relative": self.relative,
                "estimates_s": [[round(v, 7) for v in self.estimates(st)] for st in range(len(self.stages))],
                "ratios": [round(self.ratio(st), 4) for st in range(len(self.stages))],
                "reprofile_events": self.events[-300:]}
