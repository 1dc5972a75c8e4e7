"""Which of the testbed's hosts a sweep's stages run on, and in what order: ``--placements``.

A sweep without it runs each configuration on the first hosts of .env's ``HOSTS``, as many as the
split has stages. With it, each placement is a pass of its own (its hosts are the worker group's):
``1-3-2`` runs stage 1 on the first host, stage 2 on the third and stage 3 on the second, and
``all`` is every ordered subset of two hosts or more that begins with the first (the data
source, where the input is and the result must come back), as ``predict --subsets`` prices them.
A placement of m hosts runs the plans of m stages (``--split-blocks "3;2,4"`` gives two hosts the
plan 3 and three hosts 2,4), or for two hosts without a plan of one cut, ``--splits``.
"""

from __future__ import annotations

import dataclasses

from ...analysis.keys import placement_devices, placement_label
from ...errors import UsageError
from ...predict.subsets import placements as ordered_subsets
from .options import SweepOptions, plans_of

ALL = "all"


def parse_placements(text: str, hosts: int) -> list[str]:
    """``all`` or ``1-2,1-3-2`` as placement labels, checked against a testbed of ``hosts`` hosts."""
    if hosts < 2:
        raise UsageError(f"--placements {text}: placements choose among a testbed's hosts; .env names "
                         f"{hosts or 'none'} (give HOSTS=a,b,c)")
    if text.strip().lower() == ALL:
        return [placement_label(p) for p in ordered_subsets(hosts, "--placements all: a testbed of 2 to {max} hosts")]
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            devices = tuple(int(x) - 1 for x in part.split("-"))
        except ValueError:
            devices = ()
        bad = (len(devices) < 2 or devices[0] != 0 or len(set(devices)) != len(devices)
               or any(not 0 <= d < hosts for d in devices))
        if bad:
            raise UsageError(f"--placements {text}: {part!r} is not a placement of this testbed's {hosts} hosts; give "
                             f"host numbers 1 to {hosts} joined by '-', each once, beginning with 1 (the data "
                             f"source), e.g. 1-3-2, or all")
        out.append(placement_label(devices))
    return list(dict.fromkeys(out))


def pass_options(opts: SweepOptions, label: str | None) -> SweepOptions:
    """The options of one placement's pass: the testbed's hosts in the placement's order, and the
    plans of as many stages (none left: ``--splits``' two-stage splits)."""
    if label is None:
        return opts
    devices = placement_devices(label)
    testbed = dataclasses.replace(opts.testbed, hosts=[opts.testbed.hosts[i] for i in devices])
    return dataclasses.replace(opts, testbed=testbed, plans=plans_of(opts, len(devices)) or None)

