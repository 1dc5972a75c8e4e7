"""The network label of a run that named no network condition, from what its manifest recorded.

A sweep names every run's condition (``lan``, ``lte``, ...). A hand run of ``partition1.py`` /
``partition2.py`` or ``distributed_runner.py`` may name none: it runs on the link as it is (the
anchor's default), or on a tc tree the user applied by hand (``network_delay.py apply``) and read
back with ``--link tc --link-dev IFACE``. Such a run is labelled by its manifest, never left blank:

- ``unshaped``: nothing shaped the link by this run and nothing was read back;
- ``tc-rate10mbit-delay20ms-jitter5ms-loss1pct``: the tree read back, by the parameters the kernel
  holds (``tc-unshaped`` when the tree shapes nothing);
- the emulated conditions' own name, where an emulated run's configuration lost it.

The tc labels hold only letters, digits and ``-``, so that they can stand in file names.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..units import format_duration, format_rate, parse_rate
from .tctree import OPEN_RATE

#: A run on the link as it is: no shaping by the run, nothing read back.
UNSHAPED = "unshaped"
_OPEN_RATE_BPS = parse_rate(OPEN_RATE)  # the class that shapes nothing


def link_label(link: dict[str, Any] | None) -> str:
    """The label of a run's link manifest (``record["manifest"]["link"]``)."""
    link = link if isinstance(link, dict) else {}
    mode = link.get("mode")
    if mode == "emulated":
        name = (link.get("conditions") or {}).get("name")
        return str(name) if name else "emulated"
    if mode == "tc":
        return "tc-" + ("-".join(tc_parameters(link)) or UNSHAPED)
    return UNSHAPED


def tc_parameters(link: dict[str, Any]) -> list[str]:
    """``rate10mbit``, ``delay20ms``, ``jitter5ms``, ``loss1pct`` as the read-back tree holds them:
    the rate of the shaped htb class (or of a tbf), the delay, jitter and loss of a netem leaf."""
    out: list[str] = []
    rate = _shaped_rate(link.get("classes") or [], link.get("qdiscs") or [])
    if rate is not None:
        out.append(f"rate{format_rate(rate)}")
    for q in link.get("qdiscs") or []:
        if not isinstance(q, dict) or q.get("kind") != "netem":
            continue
        opts = q.get("options") or {}
        delay = opts.get("delay") if isinstance(opts.get("delay"), dict) else {}
        # tc -j gives netem's times in seconds and its loss as a fraction.
        if _number(delay.get("delay")):
            out.append(f"delay{format_duration(float(delay['delay']))}")
        if _number(delay.get("jitter")):
            out.append(f"jitter{format_duration(float(delay['jitter']))}")
        loss = opts.get("loss-random") if isinstance(opts.get("loss-random"), dict) else {}
        if _number(loss.get("loss")):
            out.append(f"loss{float(loss['loss']) * 100:g}pct".replace(".", "p"))
    return out


def _shaped_rate(classes: list[Any], qdiscs: list[Any]) -> float | None:
    rates = []
    for c in classes:
        if isinstance(c, dict) and c.get("kind") == "htb":
            try:
                rate = parse_rate(str(c.get("rate")))
            except UsageError:  # a spelling units does not know: not a rate we can name
                continue
            if rate is not None and rate < _OPEN_RATE_BPS:
                rates.append(rate)
    for q in qdiscs:
        opts = q.get("options") if isinstance(q, dict) and q.get("kind") == "tbf" else None
        if isinstance(opts, dict) and _number(opts.get("rate")):
            rates.append(float(opts["rate"]) * 8)  # tc -j gives tbf's rate in bytes per second
    return min(rates) if rates else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
