"""Parsing of tc-style quantities: durations (50ms), rates (10mbit), percentages (1%)."""

from __future__ import annotations

import re

from .errors import UsageError

_TIME = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_RATE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)

RATE_UNITS = "bit, kbit, mbit, gbit, tbit (bits per second, as tc reads them)"
TIME_UNITS = "s, ms, us"


def parse_duration(text: str | float | int | None) -> float:
    """Seconds from ``50ms``, ``0.2s``, ``100us`` (a bare number means milliseconds, as in tc)."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, (int, float)):
        return float(text) / 1e3
    m = _NUM.match(str(text))
    if not m or (m.group(2) and m.group(2).lower() not in _TIME):
        raise UsageError(f"bad duration {text!r}: use a number with one of {TIME_UNITS} (e.g. 50ms)")
    unit = m.group(2).lower() or "ms"
    return float(m.group(1)) * _TIME[unit]


def parse_rate(text: str | float | int | None) -> float | None:
    """Bits per second from ``10mbit``; ``None``/empty means unlimited.

    ``mbps`` is refused on purpose: tc reads it as megaBYTES per second, a factor of 8 that
    silently ruins an experiment.
    """
    if text is None or text == "" or (isinstance(text, str) and text.lower() in ("none", "unlimited")):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    m = _NUM.match(str(text))
    unit = (m.group(2).lower() if m else "")
    if m and unit in _RATE:
        value = float(m.group(1)) * _RATE[unit]
        if value <= 0:
            raise UsageError(f"rate {text!r} must be positive")
        return value
    hint = ""
    if unit.endswith("bps"):
        hint = f" ('{unit}' is bytes per second in tc; write {m.group(1)}{unit[:-3]}bit for bits)"
    raise UsageError(f"bad rate {text!r}: accepted units are {RATE_UNITS}{hint}")


def parse_percent(text: str | float | int | None) -> float:
    """Percent from ``1%``, ``0.5`` (already percent)."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _NUM.match(str(text))
        if not m or m.group(2) not in ("", "%"):
            raise UsageError(f"bad percentage {text!r}: write e.g. 1% or 0.5")
        value = float(m.group(1))
    if not 0 <= value <= 100:
        raise UsageError(f"percentage {text!r} must be within 0..100")
    return value


def format_rate(bits_per_s: float) -> str:
    """tc spelling of a rate, exact where possible: 10000000 -> 10mbit."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale and (bits_per_s / scale) == int(bits_per_s / scale):
            return f"{int(bits_per_s / scale)}{unit}"
    return f"{int(round(bits_per_s))}bit"


def format_duration(seconds: float) -> str:
    """tc spelling of a duration: 0.05 -> 50ms, 0.0005 -> 500us."""
    us = round(seconds * 1e6)
    if us % 1000 == 0:
        return f"{us // 1000}ms"
    return f"{us}us"
