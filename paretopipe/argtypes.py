"""The value types of command-line options: each parses one text or refuses it with one line
that names what is valid (argparse prints it as the usage error). Used by every parser, the
package's command-line faces and the stage processes' own command lines alike."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from .errors import UsageError


def _typed(name: str, convert: Callable[[str], Any], ok: Callable[[Any], bool], valid: str):
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {valid}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: {valid}")
        return value
    parse.__name__ = name  # argparse names the type in its message
    return parse


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


positive_int = _typed("positive_int", int, lambda v: v >= 1, "a whole number of at least 1")
nonneg_int = _typed("nonneg_int", int, lambda v: v >= 0, "a whole number of at least 0")
port_number = _typed("port", int, lambda v: 1 <= v <= 65535, "a TCP port, 1..65535")
port_or_zero = _typed("port", int, lambda v: 0 <= v <= 65535, "a TCP port, 0..65535 (0 = any free port)")
positive_float = _typed("positive_float", float, lambda v: v > 0 and _finite(v), "a positive number")
percent = _typed("percent", lambda t: float(str(t).strip().rstrip("%")) / 100, lambda v: 0 < v < 1,
                 "a percentage between 0 and 100, e.g. 5%")
nonneg_float = _typed("nonneg_float", float, lambda v: v >= 0 and _finite(v), "a number of at least 0")
unit_share = _typed("share", float, lambda v: 0 < v <= 1, "a share in (0, 1], e.g. 0.99")


def list_of(item: Callable[[str], Any], name: str) -> Callable[[str], list[Any]]:
    """A comma list whose every item ``item`` parses (a sweep's dimension: 128,1024)."""
    def parse(text: str) -> list[Any]:
        values = [item(part.strip()) for part in str(text).split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} names no value: give a comma list")
        return values
    parse.__name__ = name
    return parse


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    parse.__name__ = "choice"
    return parse


BACKENDS = ("tcp", "rpc")


def backend_list(text: str) -> list[str]:
    """``tcp,rpc``: the backends of a sweep, a comma list like every other dimension; ``both`` is
    ``tcp,rpc`` (the older spelling). Each backend once, in the order given."""
    named = list_of(one_of(BACKENDS + ("both",)), "backend")(text)
    return list(dict.fromkeys(b for name in named for b in (BACKENDS if name == "both" else (name,))))


def watts_per_stage(text: str) -> list[float | None]:
    """``2.7,45``: watts per stage or device, 0 or more; an empty entry (``0.9,``) leaves that one
    to its host's declaration."""
    values: list[float | None] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = float(part) if part else None
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give watts per stage, e.g. 2.7,45")
        if value is not None and not (value >= 0 and _finite(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: watts must be 0 or more")
        values.append(value)
    return values


def host_port(text: str, where: str, example: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets or not) as (host, port); ``where`` names the value in
    the one-line refusal (``MQTT_BROKER='x'``, ``--to 'x'``), ``example`` shows a valid one."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise UsageError(f"{where}: give HOST:PORT, e.g. {example}")
    return host.strip("[]"), int(port)
