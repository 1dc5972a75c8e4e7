"""tc trees for one direction of a link (:mod:`.tctree` builds their commands) applied, changed,
read back and cleared, locally or over SSH.

:func:`applied` clears what it applied on exit, error, Ctrl-C, SIGTERM or SIGHUP (an SSH session
that drops), and a second signal during the clean-up waits until the clean-up is done; a signal
whose interrupt Python dropped (a handler that ran inside a finaliser) is not lost either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import NetemError
from ..sshcmd import ssh_argv
from .conditions import Direction
from .tctree import Cmd, apply_commands, change_rate_commands, clear_commands, ifb_name

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Signals this close together are one request to stop (SIGTERM and SIGINT sent at once, a double
#: Ctrl-C): the later ones do not interrupt the clean-up the first began.
SIGNAL_BURST_S = 1.0


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
