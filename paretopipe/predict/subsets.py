"""Which devices to use at all: every subset and order of the devices as a dimension of the plan.

Adding a device to a pipeline is not free: its link adds a hop's delay and bytes, and a slow
device that takes blocks can lengthen the path as much as it shortens the bottleneck. Users of exo
and distributed-llama report that an extra node made generation slower. Here the first device
(the data source: where the input is, and where the result must come back) begins every
placement; each subset of the others, in every order, follows it, and the planner
(:func:`~paretopipe.predict.planner.pareto_plans`) finds each placement's Pareto-optimal cuts, a
stage allowed to run nothing. Per objective, the best placement with k devices is compared with
the best with k + 1: what the (k + 1)-th device buys, or costs. A language model's placements are
priced by its own cost model (:func:`price_generation`): the plan of least time to first token
and the one of least time per token, over every plan of the devices in order.

Stage order matters (a link from the Pi to the server is not one from the server to the Pi: the
activation shrinks along the model), so a subset of m other devices gives m! placements; with the
handful of devices a user owns that is a few dozen plans of the dynamic programme each.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from ..analysis import devices as measured_devices
from ..errors import UsageError
from . import lm_costmodel
from .costmodel import LinkModel
from .device_profile import DeviceProfile
from .planner import Plan, pareto_plans

#: Beyond this many devices the orders grow too fast to price every one (7 others: 13,699 placements).
MAX_DEVICES = 7
#: What each objective's best placement is chosen by, and its direction.
OBJECTIVES = {"latency": ("latency_s", "min"), "throughput": ("throughput_imgs_per_s", "max")}
#: A language model's (:mod:`paretopipe.predict.lm_costmodel`): time to first token and per token.
GENERATION_OBJECTIVES = {"ttft": ("predicted_ttft_s", "min"), "tpot": ("predicted_tpot_s", "min")}


@dataclasses.dataclass(frozen=True)
class Placement:
    """One ordered subset of the devices (indices into the profiles, the source first) and its
    Pareto-optimal plans (an image model's), or its best plan per objective (a language model's:
    ``chosen``, (objective, value, cuts) each)."""

    devices: tuple[int, ...]
    plans: tuple[Plan, ...] = ()
    chosen: tuple[tuple[str, float, tuple[int, ...]], ...] = ()

    def best(self, objective: str) -> Plan:
        attr, sense = OBJECTIVES[objective]
        pick = min if sense == "min" else max
        return pick(self.plans, key=lambda p: getattr(p, attr))

    def figure(self, objective: str) -> tuple[float, tuple[int, ...]]:
        """The best plan's value of ``objective`` and its cuts."""
        for name, value, cuts in self.chosen:
            if name == objective:
                return value, cuts
        plan = self.best(objective)
        return getattr(plan, OBJECTIVES[objective][0]), tuple(plan.cuts)


def placements(count: int, what: str = "--subsets: give 2 to {max} device profiles") -> list[tuple[int, ...]]:
    """Every ordered subset of devices 1..count-1 after device 0, two devices or more (``what``:
    the refusal's start where ``count`` is out of range)."""
    if not 2 <= count <= MAX_DEVICES:
        raise UsageError(f"{what.format(max=MAX_DEVICES)} (the first is the data source), got {count}")
    others = range(1, count)
    return [(0, *order) for k in range(1, count) for subset in itertools.combinations(others, k)
            for order in itertools.permutations(subset)]


def price(profiles: Sequence[DeviceProfile], up: LinkModel, down: LinkModel, batch_size: int,
          positions: Sequence[int], codec: str = "float32/none") -> list[Placement]:
    """Every placement's Pareto-optimal plans, every hop over the same link (``up`` forward,
    ``down`` back)."""
    out = []
    for devices in placements(len(profiles)):
        chosen = [profiles[i] for i in devices]
        hops = len(devices) - 1
        out.append(Placement(devices, tuple(pareto_plans(chosen, [up] * hops, batch_size, positions, codec,
                                                         [down] * hops))))
    return out


def price_generation(shape: Any, profiles: Sequence[dict[str, Any]], conditions: Any, prompt_len: int,
                     cut_dtype: str = "float32") -> list[Placement]:
    """A language model's placements: each one's plan of least time to first token and of least
    time per token (:func:`paretopipe.predict.lm_costmodel.best_chain`), every hop over ``conditions``."""
    phases = lm_costmodel.phases_at(shape, list(profiles), prompt_len)
    out = []
    for devices in placements(len(profiles)):
        chain = [phases[i] for i in devices]
        out.append(Placement(devices, chosen=tuple(
            (objective, *lm_costmodel.best_chain(shape, chain, conditions, prompt_len, objective, cut_dtype))
            for objective in GENERATION_OBJECTIVES)))
    return out


def measured_generation(sessions: Sequence[tuple[Sequence[str], Sequence[dict[str, Any]]]], addresses: Sequence[str],
                        network: str, prompt_len: int) -> list[Placement]:
    """A language model's placements as measured: each session is its testbed's hosts in order and
    its configurations (summary rows); a plan of m stages ran on its placement's hosts (--placements),
    else on the first m, so it measured the placement of the devices at those ``addresses`` (the
    profiles' order, the data source first). Each placement's least measured time to first token
    and per token, with its splits."""
    best: dict[tuple[int, ...], dict[str, tuple[float, tuple[int, ...]]]] = {}
    for hosts, rows in sessions:
        for row in rows:
            if row.get("status") != "complete" or row.get("network") != network or \
                    int(row.get("prompt_len") or 0) != prompt_len:
                continue
            cuts = tuple(int(c) for c in str(row["split_index"]).split(","))
            devices = _devices_of(hosts, measured_devices.row_devices(row), addresses)
            for objective in GENERATION_OBJECTIVES:
                value = float(row[f"{objective}_median_s"])
                if value == value and value < best.setdefault(devices, {}).get(objective, (float("inf"),))[0]:
                    best[devices][objective] = (value, cuts)
    return [Placement(d, chosen=tuple((o, *figures[o]) for o in GENERATION_OBJECTIVES))
            for d, figures in sorted(best.items()) if set(figures) == set(GENERATION_OBJECTIVES)]


def _devices_of(hosts: Sequence[str], ran: Sequence[int], addresses: Sequence[str]) -> tuple[int, ...]:
    """The devices (indices into ``addresses``) of the testbed ``hosts`` a configuration ``ran`` on."""
    if not hosts:
        raise UsageError(f"--validate: a session ran on this machine, not on hosts; the devices are "
                         f"{', '.join(addresses)} (--env-file's HOSTS): give sessions swept on them")
    used = [hosts[i] for i in ran if i < len(hosts)]
    if len(used) < len(ran) or any(h not in addresses for h in used) or used[0] != addresses[0]:
        raise UsageError(f"--validate: a session ran on {', '.join(used)}; the devices are {', '.join(addresses)} "
                         f"(--env-file's HOSTS, the profiles' order) and every placement begins with the first")
    return tuple(addresses.index(h) for h in used)


def marginal_gains(priced: Sequence[Placement], names: Sequence[str],
                   objectives: dict[str, tuple[str, str]] = OBJECTIVES) -> list[dict[str, Any]]:
    """Per number of devices and objective: the best placement and its figure, its ratio to the
    best with one device fewer, and whether the extra device bought a ``gain``, a ``loss`` or
    ``none`` (:func:`paretopipe.analysis.devices.marginal_gains`, which the report's measured
    table uses too)."""
    return measured_devices.marginal_gains(priced, names, {name: sense for name, (_, sense) in objectives.items()})
