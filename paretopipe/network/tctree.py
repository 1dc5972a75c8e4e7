"""The tc tree for one direction of a link, as commands (pure: nothing runs here; :mod:`.tc`
runs them, locally or over SSH, and reads the tree back).

One tree serves every case, built only of qdiscs that a kernel without ``sch_prio`` or
``sch_netem`` still has (htb, pfifo, u32, ingress, ifb):

    root htb (default class 1:1 or 1:2)
      class 1:1  rate 10gbit            everything else: unshaped (SSH, the controller, other traffic)
      class 1:2  rate R ceil R          the shaped traffic: the rate, or 10gbit when none is set
        leaf:    netem (delay, jitter, loss) where needed, else pfifo
    u32 filters steer the shaped traffic into 1:2:
      port mode:  TCP to or from the data port, IPv4 and IPv6
      peers mode: traffic to the other stage hosts' addresses, except SSH (a higher-priority filter)
      neither:    no filter; htb's default sends everything to 1:2

htb carries the rate, so a rate-only condition runs for real on such a kernel, and a trace can
change it while a run goes on (``tc class change``). ``--ingress`` redirects incoming traffic
through an ifb device that gets the same tree. Each host shapes its own egress; a sweep gives
stage 1's host the *up* direction and the last stage's host the *down* direction.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import shlex
from typing import Sequence

from ..errors import UsageError
from ..units import format_duration, format_rate
from .conditions import Direction

MTU_BYTES = 1514
ROOT = "1:"
OPEN_RATE = "10gbit"       # the unshaped class, and the shaped one when no rate is given
SHAPED = "1:2"
UNSHAPED = "1:1"
LEAF = "20:"

@dataclasses.dataclass(frozen=True)
class Cmd:
    """One command; ``tolerant`` ones may fail (deleting what is not there, creating what is)."""

    argv: tuple[str, ...]
    tolerant: bool = False

    def __str__(self) -> str:
        return shlex.join(self.argv) + ("   # may fail harmlessly" if self.tolerant else "")


@dataclasses.dataclass(frozen=True)
class Match:
    """What the shaped class carries: TCP on ``port``, traffic to ``peers`` (except SSH on
    ``ssh_port``), or everything when neither is given."""

    port: int | None = None
    peers: tuple[str, ...] = ()
    ssh_port: int = 22

    def __post_init__(self) -> None:
        if self.port is not None and not 0 < self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (1..65535)")
        for peer in self.peers:
            try:
                ipaddress.ip_address(peer)
            except ValueError:
                raise UsageError(f"peer {peer!r} is not an IP address (tc matches addresses, not names)")


def _tc(*args: str, tolerant: bool = False) -> Cmd:
    return Cmd(("tc",) + tuple(str(a) for a in args), tolerant)


def ifb_name(dev: str) -> str:
    """The ifb device used for ``dev``'s ingress (interface names are at most 15 characters)."""
    return ("ifb-" + dev)[:15]


def _netem_args(p: Direction) -> list[str]:
    args: list[str] = []
    if p.delay_s or p.jitter_s:
        args += ["delay", format_duration(p.delay_s)]
        if p.jitter_s:
            args += [format_duration(p.jitter_s), "distribution", p.distribution] if p.distribution != "uniform" \
                else [format_duration(p.jitter_s)]
    if p.loss_percent:
        args += ["loss", f"{p.loss_percent:g}%"]
    # Queue enough packets for twice the bandwidth-delay product, so netem never drops for lack of room.
    limit = 10000
    if p.rate_bps and p.delay_s:
        limit = max(1000, math.ceil(2 * p.rate_bps / 8 * (p.delay_s + p.jitter_s) / 1500))
    return args + ["limit", str(limit)]


def burst_bytes(rate_bps: float) -> int:
    """4 ms of tokens, at least two full frames: small enough to shape, large enough for htb's timer."""
    return max(2 * MTU_BYTES, math.ceil(rate_bps / 8 * 0.004))


def class_args(rate_bps: float | None) -> list[str]:
    """The shaped class's options: ``rate R ceil R burst B cburst B quantum Q``."""
    if not rate_bps:
        return ["rate", OPEN_RATE, "ceil", OPEN_RATE, "quantum", "60000"]
    rate, burst = format_rate(rate_bps), str(burst_bytes(rate_bps))
    return ["rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(min(60000, max(MTU_BYTES,
            math.ceil(rate_bps / 8 / 100))))]


def _tree(dev: str, p: Direction, match: Match) -> list[Cmd]:
    classified = match.port is not None or bool(match.peers)
    # htb cannot change its own root in place ("Change operation not supported"), so a tree already
    # there goes first: applying twice gives the same tree.
    cmds = [_tc("qdisc", "del", "dev", dev, "root", tolerant=True),
            _tc("qdisc", "replace", "dev", dev, "root", "handle", ROOT, "htb", "default",
                UNSHAPED.split(":")[1] if classified else SHAPED.split(":")[1]),
            _tc("class", "replace", "dev", dev, "parent", ROOT, "classid", UNSHAPED, "htb", "rate", OPEN_RATE,
                "ceil", OPEN_RATE, "quantum", "60000"),
            _tc("class", "replace", "dev", dev, "parent", ROOT, "classid", SHAPED, "htb", *class_args(p.rate_bps))]
    return cmds + [leaf_command(dev, p)]


def leaf_command(dev: str, p: Direction | None) -> Cmd:
    """The shaped class's queue: netem where ``p`` needs it, a plain fifo otherwise, and with no
    direction (``link:down``, :mod:`paretopipe.network.linkdown`) a fifo of no room, which drops
    every packet the class gets and keeps the tree, its filters and its rate as they are."""
    if p is None:
        return _tc("qdisc", "replace", "dev", dev, "parent", SHAPED, "handle", LEAF, "pfifo", "limit", "0")
    if p.needs_netem:
        return _tc("qdisc", "replace", "dev", dev, "parent", SHAPED, "handle", LEAF, "netem", *_netem_args(p))
    return _tc("qdisc", "replace", "dev", dev, "parent", SHAPED, "handle", LEAF, "pfifo", "limit", "10000")


def _filters(dev: str, parent: str, match: Match, action: Sequence[str]) -> list[Cmd]:
    """u32 filters sending ``match``'s traffic to ``action`` (a flowid, or a redirect to the ifb)."""
    cmds = [_tc("filter", "del", "dev", dev, "parent", parent, tolerant=True)]
    prio = 1
    if match.peers:  # SSH first, into the unshaped class: the controller keeps its connections
        keep = ["flowid", UNSHAPED] if action[0] == "flowid" else ["action", "pass"]
        for proto, family in (("ip", "ip"), ("ipv6", "ip6")):
            for direction in ("dport", "sport"):
                cmds.append(_tc("filter", "add", "dev", dev, "parent", parent, "protocol", proto, "prio", str(prio),
                                "u32", "match", family, "protocol", "6", "0xff", "match", family, direction,
                                str(match.ssh_port), "0xffff", *keep))
                prio += 1
        for peer in match.peers:
            v6 = ipaddress.ip_address(peer).version == 6
            where = "src" if action[0] != "flowid" else "dst"  # ingress: traffic from the peers
            cmds.append(_tc("filter", "add", "dev", dev, "parent", parent, "protocol", "ipv6" if v6 else "ip",
                            "prio", str(prio), "u32", "match", "ip6" if v6 else "ip", where,
                            f"{peer}/{128 if v6 else 32}", *action))
            prio += 1
        return cmds
    for proto, family in (("ip", "ip"), ("ipv6", "ip6")):
        for direction in ("dport", "sport"):
            cmds.append(_tc("filter", "add", "dev", dev, "parent", parent, "protocol", proto, "prio", str(prio),
                            "u32", "match", family, "protocol", "6", "0xff", "match", family, direction,
                            str(match.port), "0xffff", *action))
            prio += 1
    return cmds


def apply_commands(p: Direction, dev: str, ingress: bool | Direction = False, port: int | None = None,
                   peers: Sequence[str] = (), ssh_port: int = 22) -> list[Cmd]:
    """The exact commands that shape ``dev``'s egress with ``p`` (golden-tested). ``ingress`` (True:
    the same direction; a Direction: that one) shapes incoming traffic through an ifb device."""
    down = p if ingress is True else (ingress or None)
    if not p.is_shaped and not (down and down.is_shaped):
        return clear_commands(dev, bool(ingress))
    match = Match(port, tuple(peers), ssh_port)
    cmds = egress_commands(dev, p, match)
    if down is not None:
        ifb = ifb_name(dev)
        redirect = ["action", "mirred", "egress", "redirect", "dev", ifb]
        cmds += [Cmd(("ip", "link", "add", ifb, "type", "ifb"), tolerant=True),
                 Cmd(("ip", "link", "set", "dev", ifb, "up")),
                 _tc("qdisc", "replace", "dev", dev, "handle", "ffff:", "ingress")]
        if match.port is None and not match.peers:
            cmds += [_tc("filter", "del", "dev", dev, "parent", "ffff:", tolerant=True),
                     _tc("filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
                         "match", "u32", "0", "0", *redirect)]
        else:
            cmds += _filters(dev, "ffff:", match, redirect)
        cmds += _tree(ifb, down, Match())
    return cmds


def egress_commands(dev: str, p: Direction, match: Match) -> list[Cmd]:
    """The tree that shapes ``dev``'s egress with ``p``, and the filters that send ``match``'s
    traffic into its shaped class."""
    cmds = _tree(dev, p, match)
    if match.port is not None or match.peers:
        cmds += _filters(dev, ROOT, match, ["flowid", SHAPED])
    return cmds


def change_rate_commands(dev: str, rate_bps: float | None) -> list[Cmd]:
    """Change the shaped class's rate in place (a trace's next step); queued packets are kept."""
    return [_tc("class", "change", "dev", dev, "parent", ROOT, "classid", SHAPED, "htb", *class_args(rate_bps))]


def clear_commands(dev: str, ingress: bool = True) -> list[Cmd]:
    """Remove what apply added (root tree, ingress hook, ifb). Harmless on a clean interface."""
    cmds = [_tc("qdisc", "del", "dev", dev, "root", tolerant=True)]
    if ingress:
        cmds += [_tc("qdisc", "del", "dev", dev, "ingress", tolerant=True),
                 Cmd(("ip", "link", "del", ifb_name(dev)), tolerant=True)]
    return cmds
