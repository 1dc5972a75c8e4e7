"""tc trees for one direction of a link, applied and cleared locally or over SSH.

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

:func:`applied` clears what it applied on exit, error, Ctrl-C, SIGTERM or SIGHUP (an SSH session
that drops), and a second signal during the clean-up waits until the clean-up is done; a signal
whose interrupt Python dropped (a handler that ran inside a finaliser) is not lost either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import math
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import NetemError, UsageError
from ..sshcmd import ssh_argv
from ..units import format_duration, format_rate
from .conditions import Direction

MTU_BYTES = 1514
ROOT = "1:"
OPEN_RATE = "10gbit"       # the unshaped class, and the shaped one when no rate is given
SHAPED = "1:2"
UNSHAPED = "1:1"
LEAF = "20:"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Signals this close together are one request to stop (SIGTERM and SIGINT sent at once, a double
#: Ctrl-C): the later ones do not interrupt the clean-up the first began.
SIGNAL_BURST_S = 1.0


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


# -- running commands ----------------------------------------------------------------------------
class Runner:
    """Runs commands here (``ssh=None``) or on a peer over SSH with a key (never a password)."""

    def __init__(self, ssh: str | None = None, ssh_key: str | None = None, sudo: bool = False,
                 netns: str | None = None, ssh_port: int | None = None, known_hosts: str | None = None) -> None:
        self.ssh, self.ssh_key, self.sudo, self.netns = ssh, ssh_key, sudo, netns
        self.ssh_port, self.known_hosts = ssh_port, known_hosts
        if ssh:
            ssh_argv(ssh, ssh_key, ssh_port, known_hosts)  # refuses a user or host that is not one

    def argv(self, argv: Sequence[str]) -> list[str]:
        inner = list(argv)
        if self.netns:
            inner = ["ip", "netns", "exec", self.netns] + inner
        if self.sudo:
            inner = ["sudo", "-n"] + inner
        if not self.ssh:
            return inner
        return ssh_argv(self.ssh, self.ssh_key, self.ssh_port, self.known_hosts) + [shlex.join(inner)]

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        full = self.argv(argv)
        try:
            # A session of its own: Ctrl-C at the terminal must not kill the clean-up's own commands.
            out = subprocess.run(full, capture_output=True, text=True, timeout=timeout, start_new_session=True)
        except FileNotFoundError as exc:
            raise NetemError(f"{exc.filename} not found: install iproute2 (tc, ip)")
        except subprocess.TimeoutExpired:
            raise NetemError(f"timed out: {shlex.join(full)}")
        if check and out.returncode != 0:
            raise NetemError(f"{shlex.join(argv)} failed: {_explain(out.stderr)}")
        return out

    @property
    def local(self) -> bool:
        return self.ssh is None

    @property
    def where(self) -> str:
        return self.ssh or (f"netns {self.netns}" if self.netns else "local")


def _explain(stderr: str) -> str:
    text = " ".join(stderr.split())
    if "Specified qdisc kind is unknown" in text or "qdisc kind is unknown" in text:
        return f"{text} (this kernel lacks the qdisc; for netem: modprobe sch_netem)"
    if "Cannot find device" in text:
        return f"{text} (no such interface; list them with: ip -br link)"
    if "Operation not permitted" in text:
        return f"{text} (needs root)"
    if "a password is required" in text or "a terminal is required" in text:
        return f"{text} (the SSH user needs passwordless sudo for tc and ip, or log in as root)"
    return text or "unknown error"


def require_root(runner: Runner) -> None:
    if runner.local and not runner.sudo and hasattr(os, "geteuid") and os.geteuid() != 0:
        raise NetemError("changing qdiscs needs root: run with sudo, or add --dry-run to only print the commands")


def netem_available(runner: Runner | None = None) -> bool:
    """Whether the kernel has sch_netem (loaded, loadable, or built in)."""
    runner = runner or Runner()
    if runner.local and not runner.netns:
        if Path("/sys/module/sch_netem").exists():
            return True
        try:
            subprocess.run(["modprobe", "-q", "sch_netem"], capture_output=True)
        except OSError:  # no modprobe (a container, a minimal image): the module is what is loaded
            pass
        return Path("/sys/module/sch_netem").exists()
    out = runner.run(["sh", "-c", "test -e /sys/module/sch_netem || modprobe -q sch_netem; "
                                  "test -e /sys/module/sch_netem"], check=False)
    return out.returncode == 0


def check_interface(dev: str, runner: Runner) -> None:
    if not dev or dev.startswith("-") or "/" in dev or len(dev) > 15:
        raise NetemError(f"{dev!r} is not an interface name")
    out = runner.run(["ip", "-br", "link", "show", "dev", dev], check=False)
    if out.returncode != 0:
        names = runner.run(["ip", "-br", "link"], check=False).stdout.split("\n")
        known = ", ".join(line.split()[0].split("@")[0] for line in names if line.strip())
        raise NetemError(f"no interface {dev!r} on {runner.where}; interfaces: {known}")


def apply(p: Direction, dev: str, ingress: bool | Direction = False, port: int | None = None,
          runner: Runner | None = None, peers: Sequence[str] = (), ssh_port: int = 22) -> list[Cmd]:
    """Apply ``p``; on any failure roll back to a clean interface and raise. Idempotent."""
    runner = runner or Runner()
    require_root(runner)
    check_interface(dev, runner)
    down = p if ingress is True else (ingress or None)
    if (p.needs_netem or (down is not None and down.needs_netem)) and not netem_available(runner):
        raise NetemError(f"the kernel on {runner.where} has no sch_netem, so delay, jitter and loss cannot be "
                         f"applied ({p.describe()}); a rate-only condition (--rate) uses htb and works there")
    cmds = apply_commands(p, dev, ingress, port, peers, ssh_port)
    try:
        for cmd in cmds:
            runner.run(cmd.argv, check=not cmd.tolerant)
    except BaseException:
        with _signals_held():
            clear(dev, ingress=True, runner=runner)
        raise
    return cmds


def clear(dev: str, ingress: bool = True, runner: Runner | None = None) -> list[Cmd]:
    runner = runner or Runner()
    require_root(runner)
    check_interface(dev, runner)
    cmds = clear_commands(dev, ingress)
    for cmd in cmds:
        runner.run(cmd.argv, check=not cmd.tolerant)
    return cmds


def set_rate(dev: str, rate_bps: float | None, runner: Runner | None = None) -> None:
    """Change the shaped rate of an applied tree (the trace controller's step)."""
    runner = runner or Runner()
    for cmd in change_rate_commands(dev, rate_bps):
        runner.run(cmd.argv, timeout=10)


#: Counters the kernel prints among a qdisc's options: traffic, not configuration. htb counts the
#: packets that passed before any class matched (an ARP or IPv6 solicitation during a re-apply),
#: and keeping it made two reads of one configuration differ (failed CI once).
_OPTION_COUNTERS = frozenset({"direct_packets_stat"})


def show(dev: str, runner: Runner | None = None) -> list[dict[str, Any]]:
    """The qdiscs on ``dev`` as the kernel reports them (``tc -j``), parsed: their configuration,
    without traffic counters."""
    runner = runner or Runner()
    check_interface(dev, runner)
    return [{"kind": q.get("kind"), "handle": q.get("handle"),
             "parent": q.get("parent", "root" if q.get("root") else None), "root": bool(q.get("root")),
             "options": {k: v for k, v in q.get("options", {}).items() if k not in _OPTION_COUNTERS}}
            for q in _json(runner, ["tc", "-j", "qdisc", "show", "dev", dev])]


_CLASS = re.compile(r"^class (\S+) (\S+) (?:parent (\S+)|root)(?: leaf (\S+))?.*? rate (\S+) ceil (\S+)")


def classes(dev: str, runner: Runner | None = None) -> list[dict[str, Any]]:
    """The htb classes on ``dev`` with their rates as the kernel holds them (parsed from ``tc class
    show``: iproute2 prints no JSON for classes)."""
    runner = runner or Runner()
    out = []
    for line in runner.run(["tc", "class", "show", "dev", dev]).stdout.splitlines():
        m = _CLASS.match(line.strip())
        if m:
            out.append({"kind": m.group(1), "class": m.group(2), "parent": m.group(3) or "root",
                        "leaf": m.group(4), "rate": m.group(5), "ceil": m.group(6)})
    return out


def _json(runner: Runner, argv: list[str]) -> list[dict[str, Any]]:
    out = runner.run(argv)
    try:
        raw = json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        raise NetemError(f"could not parse {' '.join(argv)} output: {out.stdout[:200]!r}")
    return [x for x in raw if isinstance(x, dict)]


def observed_link_state(dev: str, runner: Runner | None = None) -> dict[str, Any]:
    """For run manifests: what the kernel says is on the link, not what a user typed."""
    runner = runner or Runner()
    state: dict[str, Any] = {"mode": "tc", "dev": dev, "host": runner.where, "qdiscs": show(dev, runner),
                             "classes": classes(dev, runner)}
    ifb = ifb_name(dev)
    if runner.run(["ip", "link", "show", "dev", ifb], check=False).returncode == 0:
        state["ingress_qdiscs"] = show(ifb, runner)
    return state


def format_show(qdiscs: list[dict[str, Any]]) -> str:
    lines = []
    for q in qdiscs:
        opts = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in (q.get("options") or {}).items())
        lines.append(f"{q['kind']:<10} handle {q['handle'] or '-':<6} parent {q['parent'] or '-':<8} {opts}".rstrip())
    return "\n".join(lines) or "(no qdiscs)"


# -- holding a tree for the duration of a block ----------------------------------------------------
@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Block SIGINT, SIGTERM and SIGHUP until the block ends; they are delivered afterwards. Only the
    main thread receives them, so only it needs holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclasses.dataclass
class Applied:
    """What ``applied`` holds: the commands that made the tree, and the signal that ends the block."""

    commands: list[Cmd]
    _fired: list[int] = dataclasses.field(default_factory=list, repr=False)

    def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or until SIGINT, SIGTERM or SIGHUP. Python runs a signal handler
        between any two bytecodes, a finaliser's (``__del__``) included, and drops what a
        finaliser raises; the signal is then recorded but its KeyboardInterrupt is gone, so the
        wait also looks at the record, and ends within a fifth of a second of such a signal."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._fired:
                raise KeyboardInterrupt(f"signal {signal.Signals(self._fired[0]).name}")
            time.sleep(min(left, 0.2))


@contextlib.contextmanager
def applied(p: Direction, dev: str, ingress: bool | Direction = False, port: int | None = None,
            runner: Runner | None = None, peers: Sequence[str] = (), ssh_port: int = 22) -> Iterator[Applied]:
    """Apply for the duration of a block; cleared on exit, error, Ctrl-C, SIGTERM or SIGHUP (an SSH
    session that drops). The first signal interrupts the block; signals in the same burst (within
    ``SIGNAL_BURST_S``) do not interrupt what it began, and signals during the clean-up wait until the
    interface is clean; then the old handlers get them. A block that only waits should wait with
    ``Applied.hold``, which no signal can miss."""
    runner = runner or Runner()
    main = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if main else set()
    fired: list[int] = []
    state = {"cleaning": False, "at": 0.0}

    def interrupt(signum, frame):
        # A second signal can reach Python right after the first (SIGTERM and SIGINT together, a
        # double Ctrl-C): it must not interrupt what the first began. A later one interrupts again:
        # Python drops what a handler raises inside a finaliser, and the user's next Ctrl-C must
        # still work then (blocking every signal after the first would lose it for good).
        now = time.monotonic()
        if state["cleaning"] or (fired and now - state["at"] < SIGNAL_BURST_S):
            return
        fired.append(signum)
        state["at"] = now
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    if main:
        for sig in SIGNALS:
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, interrupt)
    try:
        commands = apply(p, dev, ingress, port, runner, peers, ssh_port)
        yield Applied(commands, fired)
    finally:
        state["cleaning"] = True
        try:
            if main:
                signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
            clear(dev, ingress=True, runner=runner)
        finally:
            if main:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
