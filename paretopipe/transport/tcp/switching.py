"""A later stage's half of an adaptive run (two stages): the cuts a SWITCH may name (every block
cut and the run's candidates named by cut, which both stages derive from the RUN), the
self-profile it returns in RUN_OK, and the stage part each SWITCH asks for, refused unless it is
one of those cuts. The driver on stage 1 (``tcp.source``) decides; this side only obeys, checked."""

from __future__ import annotations

import dataclasses
from typing import Any


from ... import engines
from ...compute import cpushare
from ...errors import UsageError, WireError
from ...partition.stages import SegmentChains, StageBuilder, TimedChain, time_segments
from .. import inputs, wire
from ..runconfig import RunConfig

#: The frames an adaptive run adds to a later stage's input, beside TENSOR and RECORDS.
KINDS = (wire.SWITCH, wire.PROBE)


def self_profile_cuts(builder: StageBuilder, cfg: RunConfig) -> list[str]:
    """The boundaries of an adaptive run's self-profile, and the cuts it may switch to: every
    block cut and the run's candidates named by cut (both stages derive them from the RUN)."""
    return builder.adaptive_boundaries(cfg)


def self_profile_timings(builder: StageBuilder, cfg: RunConfig, index: int = 0) -> dict[str, Any]:
    """This node's segment times between the self-profile's boundaries at the run's batch size,
    under the engine stage ``index`` of the run computes on, measured once per process, batch
    size, boundaries and engine (a sweep's later adaptive runs reuse it; each run records it)."""
    cuts = self_profile_cuts(builder, cfg)
    engine = engines.stage_engine(cfg.engine, index)
    key = ("self_profile", cfg.batch_size, tuple(cuts), engine)
    cache = builder.timings
    if key not in cache:
        cpushare.join_compute_thread()  # under the same CPU share as the stage's compute
        x = next(inputs.batches("synthetic", cfg.batch_size, builder.input_size, 1, None, cfg.seed))
        cache[key] = time_segments(builder, cuts[1:-1], x, engine=engine)
    return cache[key]


@dataclasses.dataclass(frozen=True)
class Retime:
    """A compute probe stage 1 asked for (PROBE with ``{"retime": [first, count]}``): segments
    ``first``.. timed on this stage's compute thread, the answer a PROBE_ACK of batch ``seq``."""

    seq: int
    first: int
    count: int


class SwitchingStage:
    """The adaptive side of one run on a later stage. Made when the RUN is accepted (a run that
    starts anywhere but at a block cut is refused then); :meth:`run_ok_meta` measures the
    self-profile unless stage 1 brought device profiles."""

    def __init__(self, builder: StageBuilder, cfg: RunConfig) -> None:
        self.builder, self.cfg = builder, cfg
        self.switchable = self_profile_cuts(builder, cfg)  # an unknown candidate is refused here, by name
        if cfg.cuts[0] not in builder.partitioner.block_cuts():
            raise UsageError(f"an adaptive run starts at a block split, not {cfg.cuts[0]!r}")
        self.switches = 0
        self.profile: dict[str, Any] | None = None
        # Stage 2 runs its part segment by segment, each timed, and reports the times with each result.
        self.chains = SegmentChains(builder, self.switchable, engines.stage_engine(cfg.engine, 1), cfg.batch_size)
        self.probes = 0
        self._probe_input = None

    def initial(self) -> TimedChain:
        """The part the run starts with, as a timed chain."""
        return self.chains.chain(self.cfg.cuts[0], 1)

    def run_ok_meta(self) -> dict[str, Any] | None:
        """RUN_OK's meta: this node's self-profile, or nothing when the run carries device profiles."""
        if self.cfg.adaptive_split.device_profiles:
            return None
        self.profile = self_profile_timings(self.builder, self.cfg, index=1)
        return {"profile": self.profile}

    def switch(self, meta: dict[str, Any]) -> tuple[TimedChain, str]:
        """The stage part for the split a SWITCH names, and the cut it now receives at: a block cut
        or one of the run's named candidates, nothing else."""
        cuts = meta.get("cuts")
        if not (isinstance(cuts, list) and len(cuts) == 1 and cuts[0] in self.switchable):
            raise WireError(f"SWITCH names {str(cuts)[:80]!r}; an adaptive run switches between block cuts and "
                            f"the cuts its candidates name only")
        self.switches += 1
        return self.chains.chain(cuts[0], 1), cuts[0]

    def retime_request(self, seq: int, meta: dict[str, Any] | None) -> Retime | None:
        """A PROBE's compute request, checked (None: a plain link probe). Only chains from the
        model's input can be timed here without a batch: ``first`` must be 0."""
        if not meta or "retime" not in meta:
            return None
        req = meta["retime"]
        if not (isinstance(req, list) and len(req) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in req)
                and req[0] == 0 and 1 <= req[1] <= self.chains.count):
            raise WireError(f"PROBE asks to re-time {str(req)[:60]}; a compute probe names [0, count] with count "
                            f"1..{self.chains.count}")
        return Retime(seq, req[0], req[1])

    def retime(self, req: Retime) -> dict[str, Any]:
        """Run the probe (on the compute thread, under the stage's CPU share) on a synthetic batch of
        the run's size: compute does not depend on the pixels. The PROBE_ACK's meta."""
        if self._probe_input is None:
            self._probe_input = next(inputs.batches("synthetic", self.cfg.batch_size, self.builder.input_size, 1,
                                                    None, self.cfg.seed))
        self.probes += 1
        times = self.chains.retime(req.first, self._probe_input, req.count, repetitions=1)
        return {"stage2_segment_first": req.first, "stage2_segment_s": times}

    def manifest(self) -> dict[str, Any]:
        return {"switches_applied": self.switches, "compute_probes": self.probes, "self_profile": self.profile}
