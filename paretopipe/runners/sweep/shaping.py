"""``--link tc`` on the hosts: each stage host shapes its own egress (stage 1's the up direction,
the last stage's the way back) for a stretch of runs of one network, a trace's controller steps
the rate while they run, and everything is cleared after."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ...analysis.session import Session
from ...network import tc, tracecontrol
from ...network.conditions import NetworkConditions
from ..hosts import Host, Testbed
from .options import SweepOptions, stage_count


def shaped_hosts(testbed: Testbed, stages: int) -> list[tuple[Host | None, str | None]]:
    """(host, direction) pairs: every stage host's egress, the last one the way back; on one
    machine, this machine (None) once."""
    if not testbed.remote:
        return [(None, None)]
    return [(h, "down" if j == stages - 1 else "up") for j, h in enumerate(testbed.stage_hosts(stages))]


@contextlib.contextmanager
def tc_applied(opts: SweepOptions, session: Session, backend: str, conditions: NetworkConditions
               ) -> Iterator[dict[str, Any] | None]:
    """With --link tc: apply the conditions for the duration of a group of runs; cleared after.
    Yields the link state observed on the hosts (the runs' ``observed_link``), None without tc."""
    o, tb = opts, opts.testbed
    if o.link != "tc":
        yield None
        return
    hosts = shaped_hosts(tb, stage_count(o))
    addresses = [h.address for h, _ in hosts if h is not None]
    with contextlib.ExitStack() as stack:
        runners = []
        controllers: list[dict[str, Any]] = []
        for host, which in hosts:
            runner = host.runner() if host is not None else tc.Runner()
            iface = (host.iface if host is not None else None) or tb.iface
            direction = conditions.direction(which) if which else conditions.up
            if backend == "tcp":
                kw: dict[str, Any] = {"port": tb.data_port}
            elif host is not None:
                kw = {"peers": [a for a in addresses if a != host.address],
                      "ssh_port": host.ssh_port or 22}
            else:
                kw = {}  # RPC on one machine: its ports are not known in advance; shape the interface
            stack.enter_context(tc.applied(direction, iface, runner=runner, **kw))
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
        if len(runners) > 1:
            state["other_hosts"] = [tc.observed_link_state(i, r) for r, i in runners[1:]]
        yield state
