"""A run's fault as stage 1 lives through it (:mod:`paretopipe.faults`): it begins as measured
batch B is admitted (the emulated link's here, stage 2's and a tc-shaped link's through ``on_fault``,
which applies it before it returns), each settled batch says whether the split is whole again, and the run goes on past its
planned batches until it is, so that every fault run measures its recovery."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator, Sequence

from ... import faults
from ...errors import UsageError
from ...network.emulated import Outage
from ..bookkeeping import BatchBook
from ..pipeline import Action

log = logging.getLogger("paretopipe.tcp")
#: At most this many batches past the planned ones while waiting for the split to be whole again.
MAX_EXTRA_BATCHES = 100_000


class FaultRun:
    """The fault of one run on stage 1: when it began on the batch clock, the last batch served
    here after it, and whether stage 2 has served one since (the split is whole again)."""

    def __init__(self, fault: faults.Fault, book: BatchBook, warmup: int, timeout_s: float,
                 on_fault: Callable[[dict[str, Any]], None] | None, outage: Outage) -> None:
        if fault.target != "link" and on_fault is None:
            raise UsageError(f"--fault {fault.label}: nothing here can act on stage 2 (a sweep applies it)")
        self.fault, self.book, self.on_fault, self.outage = fault, book, on_fault, outage
        self.seq = warmup + fault.at_batch
        # How long past the fault's end the run may wait for stage 2 (a restarted one builds its model).
        self.patience_s = fault.seconds + timeout_s
        self.start_s: float | None = None
        self.last_local: int | None = None
        self.whole_again = False

    def begin_if_due(self, seq: int) -> dict[str, Any] | None:
        """At measured batch B: the fault begins (its event for the record), else nothing."""
        if seq != self.seq:
            return None
        self.start_s = time.monotonic() - self.book.t0
        if self.on_fault is None:  # the link's, on the emulated link: its frames are held here
            self.outage.begin(self.fault.seconds)
        else:
            self.on_fault({"fault": self.fault.label, "seq": seq})
        log.info("stage 1: fault %s at batch %d", self.fault.label, seq)
        return {"seq": seq, "event": "fault", "fault": self.fault.label, "t_s": round(self.start_s, 6)}

    def settled(self, seq: int, local: bool, now: float) -> None:
        """Batch ``seq`` ended at ``now`` (monotonic), served here (``local``) or by stage 2."""
        if self.start_s is None:
            return
        if local:
            self.last_local, self.whole_again = seq, False
        elif self.last_local is not None or now - self.book.t0 >= self.start_s + self.fault.seconds:
            self.whole_again = True

    def more(self) -> Iterator[Action]:
        """Batches past the planned ones until the split is whole again (or the patience ends)."""
        seq = self.book.total
        until = None
        while not self.whole_again and seq - self.book.total < MAX_EXTRA_BATCHES:
            if self.start_s is not None:
                until = until or self.book.t0 + self.start_s + self.patience_s
                if time.monotonic() > until:
                    log.warning("stage 1: the split was not whole again %g s after %s", self.patience_s,
                                self.fault.label)
                    return
            self.book.extend()
            yield from (Action(op, seq) for op in ("load", "admit", "compute", "send", "settle"))
            seq += 1

    def figures(self, batches: Sequence[dict[str, Any]], planned: int) -> dict[str, Any]:
        """The run's fault figures from its measured batch records."""
        return faults.outage_figures(batches, self.fault, self.start_s, planned)
