"""Link profiles (delay, jitter, loss, rate) and the in-process emulated link.

The emulated link is what single-machine runs use when tc netem is unavailable or unwanted: each
sender owns one per direction. A message is serialised at the configured rate behind any message
already on the link (so concurrent messages share the rate like a real link), then arrives one
propagation delay (plus jitter) later. Manifests label it ``{"mode": "emulated"}``, never tc.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

from .errors import UsageError
from .units import format_duration, format_rate, parse_duration, parse_percent, parse_rate

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PROFILES_FILE = Path(__file__).resolve().parent.parent / "netem" / "profiles.toml"
DISTRIBUTIONS = ("normal", "pareto", "paretonormal", "uniform")
MSS_BYTES = 1448  # TCP payload per segment on a 1500-byte MTU with timestamps


@dataclasses.dataclass(frozen=True)
class Profile:
    """One-way network conditions. ``rate_bps`` None means unlimited."""

    name: str
    delay_s: float = 0.0
    jitter_s: float = 0.0
    distribution: str = "normal"
    loss_percent: float = 0.0
    rate_bps: float | None = None
    comment: str = ""

    @property
    def is_shaped(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss_percent or self.rate_bps)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "delay_ms": self.delay_s * 1e3, "jitter_ms": self.jitter_s * 1e3,
                "distribution": self.distribution if self.jitter_s else None,
                "loss_percent": self.loss_percent,
                "rate_mbit_per_s": None if self.rate_bps is None else self.rate_bps / 1e6}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        rate = data.get("rate_mbit_per_s")
        return cls(name=str(data.get("name", "custom")), delay_s=float(data.get("delay_ms") or 0) / 1e3,
                   jitter_s=float(data.get("jitter_ms") or 0) / 1e3,
                   distribution=data.get("distribution") or "normal",
                   loss_percent=float(data.get("loss_percent") or 0),
                   rate_bps=None if rate is None else float(rate) * 1e6)

    def describe(self) -> str:
        parts = []
        if self.delay_s:
            parts.append(f"delay {format_duration(self.delay_s)}")
        if self.jitter_s:
            parts.append(f"jitter {format_duration(self.jitter_s)} {self.distribution}")
        if self.loss_percent:
            parts.append(f"loss {self.loss_percent:g}%")
        if self.rate_bps:
            parts.append(f"rate {format_rate(self.rate_bps)}")
        return f"{self.name}: " + (", ".join(parts) if parts else "no shaping")


def _profile_from_values(name: str, values: dict[str, Any]) -> Profile:
    unknown = set(values) - {"delay", "jitter", "distribution", "loss", "rate", "comment"}
    if unknown:
        raise UsageError(f"profile {name!r}: unknown keys {sorted(unknown)}; valid: delay, jitter, "
                         f"distribution, loss, rate, comment")
    dist = str(values.get("distribution") or "normal")
    if dist not in DISTRIBUTIONS:
        raise UsageError(f"profile {name!r}: distribution {dist!r} not one of {', '.join(DISTRIBUTIONS)}")
    return Profile(name=name, delay_s=parse_duration(values.get("delay")),
                   jitter_s=parse_duration(values.get("jitter")), distribution=dist,
                   loss_percent=parse_percent(values.get("loss")),
                   rate_bps=parse_rate(values.get("rate")), comment=str(values.get("comment", "")))


def load_profiles(path: str | Path | None = None) -> dict[str, Profile]:
    """All profiles of a TOML file (default ``netem/profiles.toml``)."""
    path = Path(path or PROFILES_FILE)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"profiles file not found: {path}")
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"profiles file {path} is not valid TOML: {exc}")
    return {name: _profile_from_values(name, values) for name, values in data.items()}


def get_profile(name: str | None = None, path: str | Path | None = None, **adhoc: Any) -> Profile:
    """A named profile, optionally overridden by ad-hoc values (delay=, jitter=, loss=, rate=)."""
    adhoc = {k: v for k, v in adhoc.items() if v not in (None, "")}
    if name:
        profiles = load_profiles(path)
        if name not in profiles:
            raise UsageError(f"unknown profile {name!r}; known: {', '.join(profiles)}")
        if not adhoc:
            return profiles[name]
        base = profiles[name]
        values = {"delay": f"{base.delay_s * 1e6:.0f}us", "jitter": f"{base.jitter_s * 1e6:.0f}us",
                  "distribution": base.distribution, "loss": base.loss_percent,
                  "rate": base.rate_bps, "comment": base.comment}
        values.update(adhoc)
        return _profile_from_values(name + "+custom", values)
    if not adhoc:
        raise UsageError("give --profile NAME or ad-hoc values such as --delay 50ms --rate 10mbit")
    return _profile_from_values("custom", adhoc)


class EmulatedLink:
    """One direction of a link: FIFO serialisation at ``rate`` then ``delay`` (+ jitter).

    ``schedule(nbytes)`` returns the monotonic time at which the message has fully arrived. Loss
    is emulated as TCP would experience it: each lost segment is sent again one RTT later
    (fast retransmit), which is the dominant cost of light random loss on a TCP stream.
    """

    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.profile = profile
        self._lock = threading.Lock()
        self._busy_until = 0.0
        self._last_arrival = 0.0
        self._rng = random.Random(seed)

    def _jitter(self) -> float:
        p = self.profile
        if not p.jitter_s:
            return 0.0
        if p.distribution == "uniform":
            return self._rng.uniform(-p.jitter_s, p.jitter_s)
        if p.distribution == "pareto":
            return p.jitter_s * (self._rng.paretovariate(3.0) - 1.5)
        return self._rng.gauss(0.0, p.jitter_s)

    def schedule(self, nbytes: int, now: float | None = None) -> float:
        p = self.profile
        now = time.monotonic() if now is None else now
        with self._lock:
            start = max(now, self._busy_until)
            serialise = 0.0 if not p.rate_bps else nbytes * 8 / p.rate_bps
            extra = 0.0
            if p.loss_percent:
                segments = max(1, math.ceil(nbytes / MSS_BYTES))
                lost = sum(self._rng.random() * 100 < p.loss_percent for _ in range(min(segments, 100000)))
                seg_time = 0.0 if not p.rate_bps else MSS_BYTES * 8 / p.rate_bps
                extra = lost * (seg_time + 2 * p.delay_s)
            self._busy_until = start + serialise + extra
            arrival = self._busy_until + max(0.0, p.delay_s + self._jitter())
            # A TCP stream delivers in order: jitter cannot make a later message overtake.
            arrival = max(arrival, self._last_arrival)
            self._last_arrival = arrival
            return arrival

    def manifest(self) -> dict[str, Any]:
        return {"mode": "emulated", "profile": self.profile.to_dict(),
                "note": "in-process emulation at the sender (serialisation at rate, FIFO, then delay)"}


class LinkSender:
    """Runs send actions in FIFO order on a thread, each when the link says its bytes have arrived.

    Without a link each action runs as soon as the previous one finished. Errors are kept in
    ``error`` for the owner to raise; later actions are dropped.
    """

    def __init__(self, link: "EmulatedLink | None", name: str) -> None:
        import queue

        self.link = link
        self.error: BaseException | None = None
        self._q: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, nbytes: int, action, on_sent=None) -> None:
        if self.error is not None:
            raise self.error
        self._q.put((nbytes, action, time.monotonic(), on_sent))

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            nbytes, action, submitted, on_sent = item
            try:
                if self.link is not None:
                    sleep_until(self.link.schedule(nbytes, now=submitted))
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
