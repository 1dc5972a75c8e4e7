"""``link:down`` on a link that tc shapes (:mod:`paretopipe.faults`): each host's shaped class gets a
queue of no room for the outage, so the kernel drops every packet of the data port both ways (each
host shapes its own egress), while SSH, outside the class, keeps the controller's connections. TCP
carries on as over a pulled cable: what was lost is sent again once the queue is back.

The commands are exact and golden-tested, as tc's are; an unshaped network (no tree on the
interface) gets the tree first, and loses it again when the link is back."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from . import tc, tctree
from .conditions import Direction


def down_commands(dev: str, p: Direction, port: int | None = None, peers: Sequence[str] = (),
                  ssh_port: int = 22) -> list[tctree.Cmd]:
    """Take down the link that ``p`` shapes on ``dev``'s egress (matched as :func:`tc.apply` matches it)."""
    tree = [] if p.is_shaped else tctree.egress_commands(dev, p, tctree.Match(port, tuple(peers), ssh_port))
    return tree + [tctree.leaf_command(dev, None)]


def up_commands(dev: str, p: Direction) -> list[tctree.Cmd]:
    """Bring it back as it was: the shaped class's own queue, or no tree on an unshaped network."""
    return [tctree.leaf_command(dev, p)] if p.is_shaped else tctree.clear_commands(dev, ingress=False)


@dataclasses.dataclass(frozen=True)
class ShapedEgress:
    """One host's shaped egress, as :func:`paretopipe.controller.sweep.shaping.tc_applied` applied it."""

    runner: tc.Runner
    dev: str
    direction: Direction
    port: int | None = None
    peers: tuple[str, ...] = ()
    ssh_port: int = 22


class LinkDown:
    """The shaped egresses of a group of runs, taken down and brought up together."""

    def __init__(self, egresses: Sequence[ShapedEgress]) -> None:
        self.egresses = list(egresses)
        self.is_down = False

    def down(self) -> None:
        self.is_down = True
        for e in self.egresses:
            self._run(e, down_commands(e.dev, e.direction, e.port, e.peers, e.ssh_port))

    def up(self) -> None:
        if self.is_down:
            self.is_down = False
            for e in self.egresses:
                self._run(e, up_commands(e.dev, e.direction))

    @staticmethod
    def _run(e: ShapedEgress, cmds: list[tctree.Cmd]) -> None:
        for cmd in cmds:
            e.runner.run(cmd.argv, check=not cmd.tolerant)
