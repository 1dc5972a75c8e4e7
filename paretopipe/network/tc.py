"""tc command builder and apply / clear / show, locally or over SSH.

One tree serves every profile, so delay, jitter, loss and rate always combine:

    root netem (delay, jitter, loss)  --child-->  tbf (rate)

netem shapes time, tbf shapes rate. We use tbf for the rate (rather than netem's own ``rate``)
so that a rate-only profile, the only kind a kernel without ``sch_netem`` can apply, goes
through the very same qdisc and is measured the same way. With ``--port`` the root is a
``prio`` qdisc whose priomap sends everything to band 0 (unshaped; the anchor's default
priomap let best-effort packets escape) and u32 filters steer the port's TCP traffic, both
directions and IPv4/IPv6, into band 2, which carries the netem/tbf tree. ``--ingress``
redirects incoming traffic through an ifb device that gets the same tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import NetemError, UsageError
from ..sshcmd import ssh_argv
from ..units import format_duration, format_rate
from .conditions import Direction

MTU_BYTES = 1514
ROOT = "1:"


@dataclasses.dataclass(frozen=True)
class Cmd:
    """One command; ``tolerant`` ones may fail (deleting what is not there, creating what is)."""

    argv: tuple[str, ...]
    tolerant: bool = False

    def __str__(self) -> str:
        return shlex.join(self.argv) + ("   # may fail harmlessly" if self.tolerant else "")


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


def _tbf_args(p: Direction) -> list[str]:
    rate_bytes = p.rate_bps / 8
    burst = max(2 * MTU_BYTES, math.ceil(rate_bytes * 0.004))  # 4 ms of tokens
    limit = max(30000, math.ceil(rate_bytes * 0.1))  # 100 ms of queue
    return ["tbf", "rate", format_rate(p.rate_bps), "burst", str(burst), "limit", str(limit)]


def _tree(dev: str, p: Direction, parent: str, handle: str) -> list[Cmd]:
    """netem (if needed) with a tbf child (if a rate is set) under ``parent``."""
    where = ["root"] if parent == "root" else ["parent", parent]
    major = handle.rstrip(":")
    cmds: list[Cmd] = []
    if p.needs_netem:
        cmds.append(_tc("qdisc", "replace", "dev", dev, *where, "handle", handle, "netem", *_netem_args(p)))
        if p.rate_bps:
            cmds.append(_tc("qdisc", "replace", "dev", dev, "parent", f"{major}:1", "handle",
                            f"{int(major) + 1}:", *_tbf_args(p)))
    elif p.rate_bps:
        cmds.append(_tc("qdisc", "replace", "dev", dev, *where, "handle", handle, *_tbf_args(p)))
    return cmds


def _port_filters(dev: str, parent: str, port: int, action: Sequence[str]) -> list[Cmd]:
    """u32 filters matching TCP to or from ``port`` over IPv4 (prio 1, 2) and IPv6 (prio 3, 4)."""
    cmds = [_tc("filter", "del", "dev", dev, "parent", parent, tolerant=True)]
    prio = 1
    for proto, family in (("ip", "ip"), ("ipv6", "ip6")):
        for direction in ("dport", "sport"):
            cmds.append(_tc("filter", "add", "dev", dev, "parent", parent, "protocol", proto, "prio", str(prio),
                            "u32", "match", family, "protocol", "6", "0xff",
                            "match", family, direction, str(port), "0xffff", *action))
            prio += 1
    return cmds


def _egress(dev: str, p: Direction, port: int | None) -> list[Cmd]:
    if port is None:
        return _tree(dev, p, "root", ROOT)
    cmds = [_tc("qdisc", "replace", "dev", dev, "root", "handle", ROOT, "prio", "bands", "3",
                "priomap", *(["0"] * 16))]
    cmds += _tree(dev, p, "1:3", "30:")
    cmds += _port_filters(dev, ROOT, port, ["flowid", "1:3"])
    return cmds


def apply_commands(p: Direction, dev: str, ingress: bool = False, port: int | None = None) -> list[Cmd]:
    """The exact commands that apply ``p`` on ``dev`` (golden-tested)."""
    if not p.is_shaped:
        return clear_commands(dev, ingress)
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--port {port} is not a TCP port (1..65535)")
    cmds = _egress(dev, p, port)
    if ingress:
        ifb = ifb_name(dev)
        redirect = ["action", "mirred", "egress", "redirect", "dev", ifb]
        cmds += [Cmd(("ip", "link", "add", ifb, "type", "ifb"), tolerant=True),
                 Cmd(("ip", "link", "set", "dev", ifb, "up")),
                 _tc("qdisc", "replace", "dev", dev, "handle", "ffff:", "ingress")]
        if port is None:
            cmds += [_tc("filter", "del", "dev", dev, "parent", "ffff:", tolerant=True),
                     _tc("filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "prio", "1", "u32",
                         "match", "u32", "0", "0", *redirect)]
        else:
            cmds += _port_filters(dev, "ffff:", port, redirect)
        cmds += _tree(ifb, p, "root", ROOT)
    return cmds


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

    def argv(self, argv: Sequence[str]) -> list[str]:
        inner = list(argv)
        if self.netns:
            inner = ["ip", "netns", "exec", self.netns] + inner
        if self.sudo:
            inner = ["sudo", "-n"] + inner
        if not self.ssh:
            return inner
        return ssh_argv(self.ssh, self.ssh_key, self.ssh_port, self.known_hosts) + [shlex.join(inner)]

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        full = self.argv(argv)
        try:
            out = subprocess.run(full, capture_output=True, text=True, timeout=30)
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


def _explain(stderr: str) -> str:
    text = " ".join(stderr.split())
    if "Specified qdisc kind is unknown" in text or "qdisc kind is unknown" in text:
        return f"{text} (this kernel lacks the qdisc; for netem: modprobe sch_netem)"
    if "Cannot find device" in text:
        return f"{text} (no such interface; list them with: ip -br link)"
    if "Operation not permitted" in text:
        return f"{text} (needs root)"
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
        subprocess.run(["modprobe", "-q", "sch_netem"], capture_output=True)
        return Path("/sys/module/sch_netem").exists()
    out = runner.run(["sh", "-c", "test -e /sys/module/sch_netem || modprobe -q sch_netem; "
                                  "test -e /sys/module/sch_netem"], check=False)
    return out.returncode == 0


def check_interface(dev: str, runner: Runner) -> None:
    out = runner.run(["ip", "-br", "link", "show", "dev", dev], check=False)
    if out.returncode != 0:
        names = runner.run(["ip", "-br", "link"], check=False).stdout.split("\n")
        known = ", ".join(line.split()[0].split("@")[0] for line in names if line.strip())
        raise NetemError(f"no interface {dev!r} here; interfaces: {known}")


def apply(p: Direction, dev: str, ingress: bool = False, port: int | None = None,
          runner: Runner | None = None) -> list[Cmd]:
    """Apply ``p``; on any failure roll back to a clean interface and raise. Idempotent."""
    runner = runner or Runner()
    require_root(runner)
    check_interface(dev, runner)
    if p.needs_netem and not netem_available(runner):
        raise NetemError(f"this kernel has no sch_netem, so {p.describe()} cannot be applied (delay, "
                         f"jitter and loss need netem); a rate-only profile (--rate) uses tbf and works here")
    cmds = apply_commands(p, dev, ingress, port)
    try:
        for cmd in cmds:
            runner.run(cmd.argv, check=not cmd.tolerant)
    except BaseException:
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


def show(dev: str, runner: Runner | None = None) -> list[dict[str, Any]]:
    """The qdiscs on ``dev`` as the kernel reports them (``tc -j``), parsed."""
    runner = runner or Runner()
    check_interface(dev, runner)
    out = runner.run(["tc", "-j", "qdisc", "show", "dev", dev])
    try:
        raw = json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        raise NetemError(f"could not parse tc -j output for {dev}: {out.stdout[:200]!r}")
    return [{"kind": q.get("kind"), "handle": q.get("handle"), "parent": q.get("parent", "root" if q.get("root") else None),
             "root": bool(q.get("root")), "options": q.get("options", {})} for q in raw]


def observed_link_state(dev: str, runner: Runner | None = None) -> dict[str, Any]:
    """For run manifests: what the kernel says is on the link, not what a user typed."""
    runner = runner or Runner()
    state: dict[str, Any] = {"mode": "tc", "dev": dev, "host": runner.ssh or "local", "qdiscs": show(dev, runner)}
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


@contextlib.contextmanager
def applied(p: Direction, dev: str, ingress: bool = False, port: int | None = None,
            runner: Runner | None = None) -> Iterator[list[Cmd]]:
    """Apply for the duration of a block; cleared on exit, error, Ctrl-C or SIGTERM."""
    runner = runner or Runner()
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    in_main = _in_main_thread()
    if in_main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield apply(p, dev, ingress, port, runner)
    finally:
        try:
            clear(dev, ingress=True, runner=runner)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
