"""``--link tc`` on the hosts: each stage host shapes its own egress (stage 1's the up direction,
the last stage's the way back) for a stretch of runs of one network, a trace's controller steps
the rate while they run, and everything is cleared after."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from ...analysis.session import Session
from ...network import tc, tracecontrol
from ...network.linkdown import LinkDown, ShapedEgress
from ...network.conditions import NetworkConditions
from ..hosts import Host, Testbed
from .options import SweepOptions, stage_count


def shaped_hosts(testbed: Testbed, stages: int) -> list[tuple[Host | None, str | None]]:
    """(host, direction) pairs: every stage host's egress, the last one the way back; on one
    machine, this machine (None) once."""
    if not testbed.remote:
        return [(None, None)]
    return [(h, "down" if j == stages - 1 else "up") for j, h in enumerate(testbed.stage_hosts(stages))]


def shaped_hops(host: Host | None, stage: int, port: int, broker: tuple[str, int] | None) -> list[str]:
    """Which hops of the pipeline a host's shaped egress (TCP to or from ``port``) carries: the
    data port's, or with MQTT those through the broker at ``broker``."""
    if broker is None:
        return ["every stage's frames on this machine" if host is None else f"stage{stage + 1}'s frames"]
    where = f"{broker[0]}:{broker[1]}"
    if host is None:
        return [f"stage → broker {where} and broker → stage, for every stage (one machine: each frame is "
                f"shaped twice, on its way in and out of the broker)"]
    if host.address == broker[0]:
        # Its own stage reaches the broker over loopback, which tc on the NIC does not see.
        return [f"broker {where} → the stages on other hosts"]
    return [f"stage{stage + 1} → broker {where}"]


def unshaped_hops(hosts: list[tuple[Host | None, str | None]], broker: tuple[str, int] | None) -> list[str]:
    """Hops through the broker that no shaped NIC carries: a broker on none of the stage hosts
    delivers to the stages unshaped; a broker on a stage host, that stage's own hop (loopback)."""
    if broker is None or hosts[0][0] is None:
        return []
    addresses = [h.address for h, _ in hosts if h is not None]
    if broker[0] not in addresses:
        return [f"broker {broker[0]}:{broker[1]} → every stage (the broker's host is not a stage host)"]
    return [f"stage{addresses.index(broker[0]) + 1} ↔ broker (the same host: loopback)"]


@dataclasses.dataclass(frozen=True)
class Shaped:
    """What a group of runs under ``--link tc`` runs on: the link state observed on the hosts (the
    runs' ``observed_link``) and the switch that takes that link down (``link:down``); both None
    without tc."""

    observed: dict[str, Any] | None = None
    link: LinkDown | None = None


@contextlib.contextmanager
def tc_applied(opts: SweepOptions, session: Session, backend: str, conditions: NetworkConditions,
               broker: tuple[str, int] | None = None) -> Iterator[Shaped]:
    """With --link tc: apply the conditions for the duration of a group of runs; cleared after.
    Yields what it applied (:class:`Shaped`; empty without tc).
    ``broker``: MQTT's (host, port), whose port is shaped instead of the data port, so that the
    hops through the broker carry the conditions; ``shaped_hops`` says which they are."""
    o, tb = opts, opts.testbed
    if o.link != "tc":
        yield Shaped()
        return
    hosts = shaped_hosts(tb, stage_count(o))
    addresses = [h.address for h, _ in hosts if h is not None]
    with contextlib.ExitStack() as stack:
        runners = []
        egresses: list[ShapedEgress] = []
        controllers: list[dict[str, Any]] = []
        hops: list[dict[str, Any]] = []
        for stage, (host, which) in enumerate(hosts):
            runner = host.runner() if host is not None else tc.Runner()
            iface = (host.iface if host is not None else None) or tb.iface
            direction = conditions.direction(which) if which else conditions.up
            if backend == "tcp":
                port = broker[1] if broker is not None else tb.data_port
                kw: dict[str, Any] = {"port": port}
                hops.append({"host": runner.where, "iface": iface, "direction": which or "up", "port": port,
                             "hops": shaped_hops(host, stage, port, broker)})
            elif host is not None:
                kw = {"peers": [a for a in addresses if a != host.address],
                      "ssh_port": host.ssh_port or 22}
            else:
                kw = {}  # RPC on one machine: its ports are not known in advance; shape the interface
            stack.enter_context(tc.applied(direction, iface, runner=runner, **kw))
            egresses.append(ShapedEgress(runner, iface, direction, kw.get("port"), tuple(kw.get("peers", ())),
                                         kw.get("ssh_port", 22)))
            # A trace: a controller steps the shaped rate through it while the group runs, and
            # its log of applied rates is kept in the session.
            log_path = session.trace_control_path(f"{conditions.name}-{runner.where}-{which or 'up'}")
            ctl = stack.enter_context(tracecontrol.following(direction, iface, runner, seed=o.seed or 0,
                                                             which=which or "up", log_path=log_path))
            if ctl is not None:
                controllers.append({**ctl.summary(), "log": str(log_path.relative_to(session.path))})
            runners.append((runner, iface))
        state = tc.observed_link_state(runners[0][1], runners[0][0])
        if controllers:
            state["trace_control"] = controllers
        state["conditions_requested"] = conditions.to_dict()
        if hops:
            state["shaped_hops"] = hops
            if unshaped_hops(hosts, broker):
                state["unshaped_hops"] = unshaped_hops(hosts, broker)
        if len(runners) > 1:
            state["other_hosts"] = [tc.observed_link_state(i, r) for r, i in runners[1:]]
        yield Shaped(state, LinkDown(egresses))  # the tree's clearing also ends an outage still on
