"""Compute traces: a stage's CPU share over time, replayed through its cgroup quota.

A link trace makes the network change during a run; a compute trace makes a device change: a Pi
that throttles, a neighbour that takes a core, a server that gets busy. The file is CSV
``time_s,cpu_share`` (a header line and ``#`` comments allowed), a share being a fraction of one
core as in ``--stage-cpu``. Each row's share holds until the next row; the last row holds for as
long as the step before it, and then the trace repeats (the link's CSV traces' rule, so one
reading serves both). A replay starts at a seeded offset into the trace, recorded with every step
it made, so a rerun with the same seed meets the same stretch of it.

:class:`CpuTraceController` is the compute twin of ``network.tracecontrol.TraceController``: a
thread writes the quota of each traced stage's group (``cpushare``) at every change of share,
and logs when each was due, when the kernel had it, and the share.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import math
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from .. import records, strict
from ..errors import UsageError
from . import cpushare

MAX_TRACE_BYTES = 4 * 1024 * 1024
STAGE_NAMES = ("stage1", "stage2")


@dataclasses.dataclass(frozen=True)
class CpuTrace:
    """A step function of CPU share over one period (seconds), repeating."""

    source: str
    times_s: tuple[float, ...]
    shares: tuple[float, ...]
    period_s: float

    def share_at(self, t_s: float) -> float:
        """The share at trace time ``t_s`` (wrapped into the period)."""
        i = bisect.bisect_right(self.times_s, t_s % self.period_s) - 1
        return self.shares[max(0, i)]

    def next_change_after(self, t_s: float) -> float:
        """The first trace time after ``t_s`` at which the share may change (a row's start, or
        the period's end, both unwrapped)."""
        base = math.floor(t_s / self.period_s) * self.period_s
        local = t_s - base
        i = bisect.bisect_right(self.times_s, local + 1e-9)
        return base + (self.times_s[i] if i < len(self.times_s) else self.period_s)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "format": "csv time_s,cpu_share", "period_s": self.period_s,
                "rows": len(self.times_s), "min_share": min(self.shares), "max_share": max(self.shares)}


def load(path: str | Path) -> CpuTrace:
    """A compute trace file, checked (one line naming the first fault); cached per path and mtime."""
    return _load(*records.small_file_key(path, "compute trace", MAX_TRACE_BYTES))


@functools.lru_cache(maxsize=16)
def _load(path: str, _mtime_ns: int) -> CpuTrace:
    text = records.read_text_file(path, "compute trace", "CSV time_s,cpu_share")
    return parse(text.splitlines(), path)


def parse(lines: Sequence[str], source: str = "<csv>") -> CpuTrace:
    times: list[float] = []
    shares: list[float] = []
    body = [(n, ln.strip()) for n, ln in enumerate(lines, 1) if ln.strip() and not ln.strip().startswith("#")]
    for i, (n, ln) in enumerate(body):
        cells = [c.strip() for c in ln.split(",")]
        if i == 0 and not records.is_number(cells[0]):
            continue  # header
        if len(cells) != 2:
            raise UsageError(f"compute trace {source} line {n}: expected time_s,cpu_share, got {ln[:60]!r}")
        try:
            t, share = float(cells[0]), float(cells[1])
        except ValueError:
            raise UsageError(f"compute trace {source} line {n}: {ln[:60]!r} holds a value that is not a number")
        if not (math.isfinite(t) and math.isfinite(share)) or t < 0:
            raise UsageError(f"compute trace {source} line {n}: times must be finite and >= 0")
        if share <= 0:
            raise UsageError(f"compute trace {source} line {n}: CPU share {share:g} must be > 0 "
                             f"(a fraction of one core, e.g. 0.4)")
        if times and t <= times[-1]:
            raise UsageError(f"compute trace {source} line {n}: time {t:g} s does not come after "
                             f"{times[-1]:g} s (times must increase)")
        try:
            cpushare.check_share(share)
        except UsageError as exc:
            raise UsageError(f"compute trace {source} line {n}: {exc}")
        times.append(t)
        shares.append(share)
    if not times:
        raise UsageError(f"compute trace {source} has no rows (time_s,cpu_share)")
    if times[0] != 0:
        raise UsageError(f"compute trace {source}: the first row must be at time 0")
    last_step = times[-1] - times[-2] if len(times) > 1 else 1.0
    return CpuTrace(source=source, times_s=tuple(times), shares=tuple(shares), period_s=times[-1] + last_step)


def parse_stage_traces(text: str | None, flag: str = "--stage-cpu-trace",
                       stages: Sequence[str] = STAGE_NAMES) -> dict[str, str]:
    """``stage1=FILE[,stage2=FILE]`` -> {stage: path}, each file checked now (one line per fault)."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, path = part.partition("=")
        name = name.strip()
        if not sep or not name or not path.strip():
            raise UsageError(f"{flag} {text!r}: give STAGE=FILE, e.g. stage1=pi4-throttle.csv "
                             f"(stages: {', '.join(stages)})")
        if name not in stages:
            raise UsageError(f"{flag}: unknown stage {name!r}; valid: {', '.join(stages)}")
        if name in out:
            raise UsageError(f"{flag}: {name} is given twice")
        resolved = resolve(path.strip())
        load(resolved)
        out[name] = resolved
    return out


def resolve(path: str) -> str:
    """A path as given, or the name of a shipped compute trace (``pi4-throttle``)."""
    p = Path(path).expanduser()
    if p.exists():
        return str(p)
    for candidate in (shipped_dir() / path, shipped_dir() / f"{path}.csv"):
        if candidate.is_file():
            return str(candidate)
    return str(p)


def shipped_dir() -> Path:
    """The shipped compute traces (``paretopipe/network/traces/cpu``)."""
    from importlib import resources

    return Path(str(resources.files("paretopipe.network").joinpath("traces", "cpu")))


def seeded_offset_s(trace: CpuTrace, seed: int, stage: str) -> float:
    """Where a replay starts: seeded per run seed and stage, whole milliseconds (exact in the record)."""
    rng = random.Random(f"{seed}/cpu/{stage}/{trace.source}")
    return rng.randrange(max(1, int(trace.period_s * 1000))) / 1e3


class CpuTraceController:
    """Replays ``trace`` on one stage's cgroup (``applied``, from ``cpushare``) from ``offset_s``,
    changing the quota at every change of share."""

    def __init__(self, stage: str, trace: CpuTrace, applied: dict[str, Any], offset_s: float = 0.0,
                 hierarchy: cpushare.Hierarchy | None = None) -> None:
        self.stage, self.trace, self.applied, self.offset_s = stage, trace, applied, offset_s
        self.hierarchy = hierarchy or cpushare.Hierarchy.detect()
        self.log: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = 0.0

    def start(self) -> "CpuTraceController":
        self.started = time.monotonic()
        self._apply(self.offset_s, self.started)  # the first share is in place before the first batch
        self._thread = threading.Thread(target=self._loop, name=f"cputrace-{self.stage}", daemon=True)
        self._thread.start()
        return self

    def _apply(self, trace_t: float, due: float) -> None:
        share = self.trace.share_at(trace_t)
        cpushare.set_share(self.applied, share, self.hierarchy)
        now = time.monotonic()
        self.log.append({"t_s": round(due - self.started, 6), "trace_time_s": round(trace_t, 6),
                         "cpu_share": share, "late_s": round(now - due, 6)})

    def _loop(self) -> None:
        trace_t = self.offset_s
        try:
            while True:
                trace_t = self.trace.next_change_after(trace_t)
                due = self.started + (trace_t - self.offset_s)
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                if self.trace.share_at(trace_t) != (self.log[-1]["cpu_share"] if self.log else None):
                    self._apply(trace_t, due)
        except BaseException as exc:  # kept for the record; the group stays at the last share
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def share_at(self, t_s: float) -> float:
        """The share the trace asked for ``t_s`` seconds after the controller started."""
        return self.trace.share_at(self.offset_s + t_s)

    def summary(self) -> dict[str, Any]:
        late = sorted(e["late_s"] for e in self.log)
        return {"stage": self.stage, "trace": self.trace.describe(), "offset_s": self.offset_s,
                "cgroup": self.applied.get("cgroup"), "steps": self.log[-400:],
                "late_median_s": late[len(late) // 2] if late else None, "late_max_s": late[-1] if late else None,
                "error": None if self.error is None else str(self.error)}


@dataclasses.dataclass(frozen=True)
class StageTrace:
    """One stage's compute trace as a run is told it: which stage, its group, the file, the offset."""

    stage: str
    cgroup: str
    trace: str
    offset_s: float | None = None  # None: seeded from the run's seed

    @classmethod
    def of(cls, data: Any) -> "StageTrace":
        """From a command's JSON, checked by name (it crosses a process boundary)."""
        spec = strict.from_dict(cls, data, "cpu trace")
        if spec.stage not in STAGE_NAMES:
            raise UsageError(f"cpu trace: unknown stage {spec.stage!r}; valid: {', '.join(STAGE_NAMES)}")
        if not Path(spec.cgroup).name.startswith(cpushare.GROUP_PREFIX):
            raise UsageError(f"cpu trace: {spec.cgroup!r} is not a group ParetoPipe made")
        return spec

    def controller(self, seed: int) -> CpuTraceController:
        trace = load(self.trace)
        offset = seeded_offset_s(trace, seed, self.stage) if self.offset_s is None else self.offset_s
        return CpuTraceController(self.stage, trace, {"cgroup": self.cgroup}, offset)


@contextlib.contextmanager
def own_group(stage: str, path: str | None) -> Iterator[list[StageTrace]]:
    """A hand-run stage replaying ``path`` on itself: its compute threads in a group of their own
    (at the trace's first share) for the block, and the spec to replay; nothing without a trace."""
    if path is None:
        yield []
        return
    applied = cpushare.limit_compute(os.getpid(), load(path).shares[0], stage)
    try:
        yield [StageTrace(stage, applied["cgroup"], path)]
    finally:
        cpushare.release(applied, os.getpid())


class Replays:
    """Every traced stage of one run, started together (at the link's start) and stopped together."""

    def __init__(self, specs: Sequence[StageTrace], seed: int) -> None:
        self.controllers = [s.controller(seed) for s in specs]

    def start(self) -> None:
        for c in self.controllers:
            c.start()

    def stop(self) -> list[dict[str, Any]]:
        for c in self.controllers:
            c.stop()
        return [c.summary() for c in self.controllers]
