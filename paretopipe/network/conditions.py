"""Named network conditions: per direction a delay, jitter, loss and rate (or a trace).

*Up* is the direction away from the data source (stage 1, the edge device) towards the later
stages; *down* is the way back. Real access links are asymmetric (3G: 768 kbit/s up, 1.6 Mbit/s
down), so every value may differ per direction. The named conditions live in ``profiles.toml``
(package data); any key may carry an ``_up`` or ``_down`` suffix, and ad-hoc values may be
written ``UP/DOWN`` (``--rate 768kbit/1600kbit``).

This module is pure arithmetic and parsing: the emulated link, the tc trees and the cost model
all read the same :class:`Direction`, so none of them restates the fields or the loss rule.
"""

from __future__ import annotations

import dataclasses
import math
from importlib import resources
from pathlib import Path
from typing import Any

from .. import records
from ..compute import cputrace
from ..errors import UsageError
from ..units import format_duration, format_rate, parse_duration, parse_percent, parse_rate

DISTRIBUTIONS = ("normal", "pareto", "paretonormal", "uniform")
MSS_BYTES = 1448  # TCP payload per segment on a 1500-byte MTU with timestamps
CPU_TRACE_KEYS = ("cpu_trace_stage1", "cpu_trace_stage2")
VALUE_KEYS = ("delay", "jitter", "distribution", "loss", "rate", "trace", "energy_nj_per_bit")
FILE_NAME = "profiles.toml"


def default_file() -> Path:
    """The shipped ``profiles.toml`` (package data, so an installed wheel has it too)."""
    return Path(str(resources.files(__package__).joinpath(FILE_NAME)))


@dataclasses.dataclass(frozen=True)
class Direction:
    """One direction of a link. ``rate_bps`` None means unlimited; ``trace`` names a rate trace."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    distribution: str = "normal"
    loss_percent: float = 0.0
    rate_bps: float | None = None
    trace: str | None = None
    # What sending one bit costs the sender's radio or NIC, declared by the user with its source
    # (``energy_source``): the link's modelled energy per image. Not part of the shaping.
    energy_nj_per_bit: float | None = None

    @property
    def is_shaped(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss_percent or self.rate_bps or self.trace)

    @property
    def needs_netem(self) -> bool:
        """Delay, jitter and loss need the kernel's netem; a rate alone does not."""
        return bool(self.delay_s or self.jitter_s or self.loss_percent)

    # -- the one statement of the link's arithmetic ------------------------------------------
    def serialise_s(self, nbytes: int, lost_segments: float = 0.0) -> float:
        """Time the link is busy sending ``nbytes``, with ``lost_segments`` resent one RTT later
        each (TCP's fast retransmit: the dominant cost of light random loss on a stream)."""
        if not self.rate_bps:
            seg_s = 0.0
            ser = 0.0
        else:
            seg_s = MSS_BYTES * 8 / self.rate_bps
            ser = nbytes * 8 / self.rate_bps
        return ser + lost_segments * (seg_s + 2 * self.delay_s)

    def segments(self, nbytes: int) -> int:
        return max(1, math.ceil(nbytes / MSS_BYTES))

    def expected_lost_segments(self, nbytes: int) -> float:
        return self.segments(nbytes) * self.loss_percent / 100

    def expected_delay_s(self) -> float:
        """E[max(0, delay + jitter)]: neither the emulator nor netem delivers before sending."""
        d, j = self.delay_s, self.jitter_s
        if not j:
            return d
        if self.distribution == "uniform":  # jitter ~ U(-j, j)
            lo, hi = d - j, d + j
            if lo >= 0:
                return d
            return max(hi, 0.0) ** 2 / (2 * (hi - lo))
        # normal (and, as an approximation, the pareto mixes): jitter ~ N(0, j)
        z = d / j
        return d * 0.5 * (1 + math.erf(z / math.sqrt(2))) + j * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    def sample_jitter(self, rng) -> float:
        if not self.jitter_s:
            return 0.0
        if self.distribution == "uniform":
            return rng.uniform(-self.jitter_s, self.jitter_s)
        if self.distribution == "pareto":
            return self.jitter_s * (rng.paretovariate(3.0) - 1.5)
        return rng.gauss(0.0, self.jitter_s)

    def sample_lost_segments(self, nbytes: int, rng) -> int:
        if not self.loss_percent:
            return 0
        count = min(self.segments(nbytes), 100_000)
        return sum(rng.random() * 100 < self.loss_percent for _ in range(count))

    # -- forms ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {"delay_ms": self.delay_s * 1e3, "jitter_ms": self.jitter_s * 1e3,
               "distribution": self.distribution if self.jitter_s else None,
               "loss_percent": self.loss_percent,
               "rate_mbit_per_s": None if self.rate_bps is None else self.rate_bps / 1e6,
               "trace": self.trace}
        if self.energy_nj_per_bit is not None:
            out["energy_nj_per_bit"] = self.energy_nj_per_bit
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Direction":
        if not isinstance(data, dict):
            raise UsageError(f"a link direction must be an object, got {type(data).__name__}")
        rate = data.get("rate_mbit_per_s")
        try:
            out = cls(delay_s=float(data.get("delay_ms") or 0) / 1e3,
                      jitter_s=float(data.get("jitter_ms") or 0) / 1e3,
                      distribution=str(data.get("distribution") or "normal"),
                      loss_percent=float(data.get("loss_percent") or 0),
                      rate_bps=None if rate is None else float(rate) * 1e6,
                      trace=None if data.get("trace") is None else str(data["trace"]),
                      energy_nj_per_bit=None if data.get("energy_nj_per_bit") is None
                      else float(data["energy_nj_per_bit"]))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"a link direction has a value that is not a number: {exc}")
        if out.distribution not in DISTRIBUTIONS or out.delay_s < 0 or out.jitter_s < 0 \
                or not 0 <= out.loss_percent <= 100 or (out.rate_bps is not None and out.rate_bps <= 0) \
                or (out.energy_nj_per_bit is not None and not 0 <= out.energy_nj_per_bit < math.inf):
            raise UsageError(f"a link direction is out of range: {data}")
        return out

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
        if self.trace:
            parts.append(f"trace {Path(self.trace).name}")
        return ", ".join(parts) if parts else "no shaping"


@dataclasses.dataclass(frozen=True)
class NetworkConditions:
    """Named conditions of a link: ``up`` (from stage 1 onwards) and ``down`` (the way back)."""

    name: str
    up: Direction = Direction()
    down: Direction = Direction()
    comment: str = ""
    energy_source: str = ""  # where the directions' energy_nj_per_bit come from (a paper, a datasheet)
    #: Compute traces the network brings with it, (stage, path) pairs: a device that changes under it.
    cpu_traces: tuple[tuple[str, str], ...] = ()

    @property
    def symmetric(self) -> bool:
        return self.up == self.down

    @property
    def is_shaped(self) -> bool:
        return self.up.is_shaped or self.down.is_shaped

    @property
    def needs_netem(self) -> bool:
        return self.up.needs_netem or self.down.needs_netem

    def direction(self, which: str) -> Direction:
        if which not in ("up", "down"):
            raise ValueError(f"direction {which!r}: up or down")
        return self.up if which == "up" else self.down

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "up": self.up.to_dict(), "down": self.down.to_dict()}
        if self.energy_source:
            out["energy_source"] = self.energy_source
        if self.cpu_traces:
            out["cpu_traces"] = dict(self.cpu_traces)
        return out

    def to_values(self) -> dict[str, Any]:
        """Exact ``profiles.toml`` keys per direction (``conditions_from_values`` reads them back
        to an equal object): durations in seconds with every digit, rates in bit/s."""
        out: dict[str, Any] = {}
        for which in ("up", "down"):
            d = self.direction(which)
            out.update({f"delay_{which}": _exact(d.delay_s, format_duration, parse_duration, "s"),
                        f"jitter_{which}": _exact(d.jitter_s, format_duration, parse_duration, "s"),
                        f"distribution_{which}": d.distribution, f"loss_{which}": d.loss_percent})
            if d.rate_bps is not None:
                out[f"rate_{which}"] = _exact(d.rate_bps, format_rate, parse_rate, "bit")
            if d.trace is not None:
                out[f"trace_{which}"] = d.trace
            if d.energy_nj_per_bit is not None:
                out[f"energy_nj_per_bit_{which}"] = d.energy_nj_per_bit
        if self.comment:
            out["comment"] = self.comment
        if self.energy_source:
            out["energy_source"] = self.energy_source
        out.update({f"cpu_trace_{stage}": path for stage, path in self.cpu_traces})
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NetworkConditions":
        if not isinstance(data, dict) or not isinstance(data.get("up"), dict) or not isinstance(data.get("down"), dict):
            raise UsageError("network conditions must be an object with 'up' and 'down' directions")
        traces = data.get("cpu_traces") or {}
        if not isinstance(traces, dict) or not all(isinstance(v, str) for v in traces.values()):
            raise UsageError("network conditions' cpu_traces must map a stage name to a trace file")
        return cls(name=str(data.get("name", "custom"))[:100], up=Direction.from_dict(data["up"]),
                   down=Direction.from_dict(data["down"]), energy_source=str(data.get("energy_source") or "")[:500],
                   cpu_traces=tuple(sorted((str(k), v) for k, v in traces.items())))

    def describe(self) -> str:
        if self.symmetric:
            return f"{self.name}: {self.up.describe()}"
        return f"{self.name}: up {self.up.describe()}; down {self.down.describe()}"


def _exact(value: float, fmt, parse, unit: str) -> str:
    """tc's readable spelling when it reads back to the same float, every digit otherwise."""
    text = fmt(value)
    return text if parse(text) == value else f"{value!r}{unit}"


# -- reading profiles.toml and ad-hoc values --------------------------------------------------
def _direction(name: str, values: dict[str, Any], which: str, base_dir: Path | None) -> Direction:
    def pick(key: str) -> Any:
        specific = values.get(f"{key}_{which}")
        return specific if specific is not None else values.get(key)

    dist = str(pick("distribution") or "normal")
    if dist not in DISTRIBUTIONS:
        raise UsageError(f"network {name!r}: distribution {dist!r} not one of {', '.join(DISTRIBUTIONS)}")
    trace = pick("trace")
    if trace is not None:
        path = Path(str(trace)).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        trace = str(path)
    if trace is not None and pick("rate") is not None:
        raise UsageError(f"network {name!r} ({which}): give a rate or a trace, not both (the trace is the rate)")
    energy = pick("energy_nj_per_bit")
    if energy is not None and (isinstance(energy, bool) or not isinstance(energy, (int, float))
                               or not 0 <= energy < math.inf):
        raise UsageError(f"network {name!r} ({which}): energy_nj_per_bit {energy!r}: give nanojoules per bit, 0 or more")
    try:
        return Direction(delay_s=parse_duration(pick("delay")), jitter_s=parse_duration(pick("jitter")),
                         distribution=dist, loss_percent=parse_percent(pick("loss")),
                         rate_bps=parse_rate(pick("rate")), trace=trace,
                         energy_nj_per_bit=None if energy is None else float(energy))
    except UsageError as exc:
        raise UsageError(f"network {name!r} ({which}): {exc}")


def _split_adhoc(values: dict[str, Any]) -> dict[str, Any]:
    """``rate = "768kbit/1600kbit"`` -> rate_up, rate_down (ad-hoc command-line form)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, str) and "/" in value and key in VALUE_KEYS and key not in ("trace", "energy_nj_per_bit"):
            up, _, down = value.partition("/")
            out[f"{key}_up"], out[f"{key}_down"] = up, down
        else:
            out[key] = value
    return out


def conditions_from_values(name: str, values: dict[str, Any], base_dir: Path | None = None) -> NetworkConditions:
    """One table of profiles.toml (or ad-hoc values) -> :class:`NetworkConditions`."""
    values = _split_adhoc(values)
    valid = set(VALUE_KEYS) | {f"{k}_{d}" for k in VALUE_KEYS for d in ("up", "down")} | {"comment", "energy_source"} \
        | set(CPU_TRACE_KEYS)
    unknown = sorted(set(values) - valid)
    if unknown:
        raise UsageError(f"network {name!r}: unknown key {unknown[0]!r}; valid: {', '.join(VALUE_KEYS)} "
                         f"(each also with _up or _down), comment, energy_source, {', '.join(CPU_TRACE_KEYS)}")
    up, down = _direction(name, values, "up", base_dir), _direction(name, values, "down", base_dir)
    source = str(values.get("energy_source", ""))
    if (up.energy_nj_per_bit is not None or down.energy_nj_per_bit is not None) and not source.strip():
        raise UsageError(f"network {name!r}: energy_nj_per_bit needs energy_source, where the constant comes from "
                         f"(a measurement, a paper, a datasheet): a modelled figure names its source")
    return NetworkConditions(name=name, up=up, down=down, comment=str(values.get("comment", "")), energy_source=source,
                             cpu_traces=_cpu_traces(name, values, base_dir))


def _cpu_traces(name: str, values: dict[str, Any], base_dir: Path | None) -> tuple[tuple[str, str], ...]:
    """``cpu_trace_stage1 = "FILE"`` keys -> (stage, path) pairs, each file checked (a relative
    path is the network file's neighbour, else a shipped compute trace's name)."""
    out = []
    for key in CPU_TRACE_KEYS:
        if values.get(key) is None:
            continue
        path = Path(str(values[key])).expanduser()
        if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
            path = base_dir / path
        try:
            resolved = cputrace.resolve(str(path))
            cputrace.load(resolved)
        except UsageError as exc:
            raise UsageError(f"network {name!r} ({key}): {exc}")
        out.append((key.removeprefix("cpu_trace_"), resolved))
    return tuple(out)


def load_conditions(path: str | Path | None = None) -> dict[str, NetworkConditions]:
    """Every named condition of a TOML file (default: the shipped ``profiles.toml``)."""
    path = Path(path) if path else default_file()
    data = records.read_toml(path, "network conditions file")
    bad = [k for k, v in data.items() if not isinstance(v, dict)]
    if bad:
        raise UsageError(f"network conditions file {path}: {bad[0]!r} is not a table ([{bad[0]}] with keys)")
    return {name: conditions_from_values(name, values, path.parent) for name, values in data.items()}


def get_conditions(name: str | None = None, path: str | Path | None = None, **adhoc: Any) -> NetworkConditions:
    """Named conditions, optionally overridden by ad-hoc values (delay=, jitter=, loss=, rate=, trace=)."""
    adhoc = {k: v for k, v in adhoc.items() if v not in (None, "")}
    if name:
        known = load_conditions(path)
        if name not in known:
            raise UsageError(f"unknown network {name!r}; known: {', '.join(known)}")
        if not adhoc:
            return known[name]
        base = known[name]
        # Override only the fields given, per direction, so the named values stay exact.
        given = _split_adhoc(adhoc)
        changes = {}
        for which in ("up", "down"):
            picked = {k: given.get(f"{k}_{which}", given.get(k)) for k in VALUE_KEYS}
            parsed = _direction(name, {k: v for k, v in picked.items() if v is not None}, which, None)
            fields = {"delay": "delay_s", "jitter": "jitter_s", "distribution": "distribution", "loss": "loss_percent",
                      "rate": "rate_bps", "trace": "trace", "energy_nj_per_bit": "energy_nj_per_bit"}
            changes[which] = dataclasses.replace(base.direction(which), **{
                f: getattr(parsed, f) for k, f in fields.items() if picked[k] is not None})
        return NetworkConditions(name + "+custom", changes["up"], changes["down"], base.comment)
    if not adhoc:
        raise UsageError("give --network NAME or ad-hoc values such as --delay 50ms --rate 10mbit")
    return conditions_from_values("custom", adhoc)
