"""What decides a batch's split: a :class:`SplitPolicy`, consulted by the data source's driver
(``tcp.source``) before each batch and fed what the driver observes on the link.

The driver owns the mechanics every run may use (sending SWITCH before a batch whose cuts changed,
timing probes, the deadline after which stage 1 finishes a batch itself, reconnecting to a stage
that came back); a policy only decides. :class:`StaticPolicy` is a measured split: always the
run's cuts. The adaptive policy (``predict.adaptive_policy.AdaptivePolicy``: the link estimator, the
cost-model chooser and its hysteresis) has the same methods and no torch; the controller builds it,
because its device profiles may need this node's self-profile. A new policy goes beside these two
and implements the protocol; nothing in the driver changes.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence


class SplitPolicy(Protocol):
    """The split decision of one run, as stage 1's driver consults it."""

    #: True when the split may change during the run (stage 2 then accepts SWITCH and PROBE).
    adaptive: bool

    def start(self, peer_meta: dict[str, Any]) -> None:
        """Stage 2 accepted the run; ``peer_meta`` is its RUN_OK meta (an adaptive stage 2's
        self-profile)."""

    def startup_probes(self) -> Sequence[int]:
        """Probe sizes (bytes; 0 is a ping) to time once the link starts, before the first batch."""

    def cuts_for(self, seq: int, current: list[str] | None) -> tuple[list[str], dict[str, Any]]:
        """The cuts batch ``seq`` runs with, given the next stage's ``current`` cuts (``None``: no
        next stage, the batch is served here), and fields for the batch's record."""

    def observe(self, up_bytes: int, net_s: float, kind: str) -> None:
        """One frame's time on the network, send to decoded reply with the peer's work taken out:
        ``kind`` is ``result``, ``late`` (the deadline passed first: a lower bound) or ``probe``."""

    def probes_due(self, now: float) -> Sequence[int]:
        """Probe sizes to time between two batches (the policy's view of the link is stale)."""

    def summary(self) -> dict[str, Any]:
        """What the record's stage-1 manifest keeps about the policy's decisions."""

    #: The boundaries (cuts, the model's input and output included) between which the stages
    #: time each segment on every batch; None: the policy does not watch compute.
    segments: list[str] | None

    def observe_compute(self, seq: int, stage: int, first: int, times: Sequence[float]) -> None:
        """Stage ``stage`` (0: stage 1) ran segments ``first``.. of batch ``seq`` in ``times``."""

    def reprofiles_due(self) -> Sequence[tuple[int, str]]:
        """Segments (and why) for stage 1 to re-time on itself before the next batch."""

    def reprofiled(self, seq: int, first: int, times: Sequence[float], whys: Sequence[str]) -> None:
        """Stage 1 re-timed segments ``first``.. (consecutive, as asked, each with its reason)."""

    def stage2_probes_due(self) -> Sequence[tuple[int, int]]:
        """Compute probes for stage 2 before the next batch: (first segment, count) each."""

    def stage2_probed(self, seq: int, first: int, times: Sequence[float]) -> None:
        """Stage 2 answered a compute probe with the times of segments ``first``.."""


class StaticPolicy:
    """One split for the whole run: the measured split of a sweep."""

    adaptive = False
    segments = None

    def __init__(self, cuts: Sequence[str]) -> None:
        self.cuts = list(cuts)

    def start(self, peer_meta: dict[str, Any]) -> None:
        pass

    def startup_probes(self) -> Sequence[int]:
        return ()

    def cuts_for(self, seq: int, current: list[str] | None) -> tuple[list[str], dict[str, Any]]:
        return self.cuts, {}

    def observe(self, up_bytes: int, net_s: float, kind: str) -> None:
        pass

    def probes_due(self, now: float) -> Sequence[int]:
        return ()

    def summary(self) -> dict[str, Any]:
        return {}

    def observe_compute(self, seq: int, stage: int, first: int, times: Sequence[float]) -> None:
        pass

    def reprofiles_due(self) -> Sequence[tuple[int, str]]:
        return ()

    def reprofiled(self, seq: int, first: int, times: Sequence[float], whys: Sequence[str]) -> None:
        pass

    def stage2_probes_due(self) -> Sequence[tuple[int, int]]:
        return ()

    def stage2_probed(self, seq: int, first: int, times: Sequence[float]) -> None:
        pass
