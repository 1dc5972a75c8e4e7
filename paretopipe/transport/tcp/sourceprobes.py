"""Stage 1's measurements for its split policy, between batches (outside every batch's latency,
inside the run's wall time): PROBE round trips that time the link, compute probes that ask stage 2
to time segments it runs none of, stage 2's per-segment times off each result, and segments of this
stage re-timed where the policy asks. A guarded run's stage 1 (:class:`.source.Stage1Run`) mixes
this in; a probe unanswered loses the next stage as a batch would."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from ...errors import ParetoPipeError, PeerError, WireError
from ...partition.stages import SegmentChains
from .. import wire
from ..policy import SplitPolicy
from ..runconfig import RunConfig
from .messages import read_segment_times
from .nextstage import NextStage, consecutive

log = logging.getLogger("paretopipe.tcp")


class PolicyProbes:
    """What a guarded stage 1 measures for its policy between batches (mixed into Stage1Run,
    which holds the attributes below)."""

    cfg: RunConfig
    policy: SplitPolicy
    next: NextStage | None
    counts: dict[str, Any]
    chains: SegmentChains | None
    chain: Any
    _probe_seq: int
    _late: Callable[[], None]
    _lose_next: Callable[[str, int], None]

    def measure_for_policy(self, seq: int) -> None:
        """After batch ``seq``: this stage's segments re-timed, then the compute probes and link
        probes the policy asks for; a probe that fails loses the next stage."""
        self._reprofile(seq)
        for first, count in self.policy.stage2_probes_due() if self.next is not None else ():
            try:
                self._compute_probe(seq, first, count)
            except (ParetoPipeError, OSError) as exc:
                self._lose_next(str(exc), seq)
                break
        for size in self.policy.probes_due(time.monotonic()) if self.next is not None else ():
            try:
                self._probe(size)
            except (ParetoPipeError, OSError) as exc:
                self._lose_next(str(exc), seq)
                break

    def _probe(self, nbytes: int) -> None:
        """Time one PROBE round trip through the link (between batches) for the policy."""
        payload = torch.zeros(nbytes, dtype=torch.uint8) if nbytes else None
        enc = wire.encode(wire.PROBE, self._probe_seq, payload)
        sent = time.monotonic()
        self.next.sender.submit(enc)
        f, arrived, why = self.next.await_frame(wire.PROBE_ACK, self._probe_seq, sent + self.cfg.timeout_s,
                                                self._late)
        self._probe_seq += 1
        if f is None:
            raise PeerError(f"probe unanswered ({why})")
        f.release()
        self.policy.observe(enc.wire_nbytes, arrived - sent, "probe" if nbytes else "ping")
        self.counts["probes"] += 1
        self.counts["probe_bytes"] += enc.total_nbytes

    def _compute_probe(self, seq: int, first: int, count: int) -> None:
        """Ask stage 2 to time segments ``first``.. on itself (between batches: its speed while it
        runs none of them); its times go to the policy, not to the link estimate."""
        enc = wire.encode(wire.PROBE, self._probe_seq, meta={"retime": [first, count]})
        self.next.sender.submit(enc)
        f, _, why = self.next.await_frame(wire.PROBE_ACK, self._probe_seq, time.monotonic() + self.cfg.timeout_s,
                                          self._late)
        self._probe_seq += 1
        if f is None:
            raise PeerError(f"compute probe unanswered ({why})")
        meta = f.meta
        f.release()
        try:
            got_first, times = read_segment_times(meta or {}, self.chains.count)
        except WireError as exc:
            log.warning("stage 1: %s", exc)
            return
        self.policy.stage2_probed(seq, got_first, times)
        self.counts["compute_probes"] = self.counts.get("compute_probes", 0) + 1

    def _observe_stage2(self, seq: int, meta: dict[str, Any] | None) -> None:
        """Stage 2's per-segment times of this batch (checked: they come from the peer)."""
        try:
            first, times = read_segment_times(meta or {}, self.chains.count)
        except WireError as exc:
            log.warning("stage 1: %s", exc)
            return
        if times:
            self.policy.observe_compute(seq, 1, first, times)

    def _reprofile(self, seq: int) -> None:
        """Re-time on this stage the segments the policy asks for, each run of consecutive ones
        chained from the activation this batch had at its start (between batches: outside every
        batch's latency, inside the run's wall time)."""
        due = list(self.policy.reprofiles_due())
        chain = self.chain
        if not due or chain is None:
            return
        started = time.monotonic()
        for run in consecutive(due):
            at = run[0][0] - chain.first
            if not 0 <= at < len(chain.inputs):
                continue  # its input never passed through this stage this batch
            times = self.chains.retime(run[0][0], chain.inputs[at], len(run), repetitions=1 if len(run) > 2 else 3)
            self.policy.reprofiled(seq, run[0][0], times, [why for _, why in run])
        self.counts["reprofile_s"] = round(self.counts.get("reprofile_s", 0.0) + time.monotonic() - started, 6)
