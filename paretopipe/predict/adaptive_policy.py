"""The adaptive split's arithmetic: a link estimate from stage 1's own frames, and a split choice
from device profiles and the cost model, with hysteresis, and :class:`AdaptivePolicy`, the split
policy they make for stage 1's driver (``transport.policy``). No torch: the driver measures, this
module decides; controller/adaptive_setup.py builds the policy for a model.

The link seen by one batch is ``net = rtt + up_bytes / goodput`` (the result coming back is a
few bytes of logits, so its serialisation is folded into the RTT). Stage 1 knows ``net`` for every
batch without another machine's clock: the time from handing its frame to the sender until the
decoded result is back, minus the durations stage 2 reports for its own work. Small frames
(probes, the logits of k = K) measure the RTT; large ones the seconds per byte after the RTT.
The RTT is the minimum of the last ``RTT_WINDOW`` small-frame samples (as BBR's min_rtt): a
sample is the RTT plus whatever scheduling delay the two hosts added, never less, so the minimum is
the estimate and a rate computed from it errs on the slow, safe side. The rate is smoothed
exponentially in log space, so that a link that recovers tenfold is
followed as fast as one that collapses tenfold (smoothing seconds per byte linearly lets one slow
sample outweigh many fast ones, and smoothing the rate linearly the reverse).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import time
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..network.conditions import Direction
from .compute_tracker import ComputeTracker
from .costmodel import LinkModel, chain_terms
from .device_profile import RESULT_CODEC, SCHEMA, DeviceProfile

SMALL_FRAME_BYTES = 4096        # at most this: the frame measures the round trip
LARGE_FRAME_BYTES = 16 * 1024   # at least this: the frame measures the rate
PROBE_BYTES = 32 * 1024
RTT_WINDOW = 8
PROBE_ALPHA = 0.7               # a probe is a deliberate, clean sample: it weighs more
PROBE_INTERVAL_S = 1.0          # a rate (or RTT) sample older than this asks for a probe
COMPUTE_PROBE_INTERVAL_S = 1.0  # stage 1 idle this long: re-time its first segments (ours, not SCIoT's)
STARTUP_PINGS = 3
STARTUP_PROBES = 2


@dataclasses.dataclass
class LinkEstimate:
    rtt_s: float | None = None
    s_per_byte: float | None = None
    samples: int = 0

    @property
    def goodput_bps(self) -> float | None:
        return 8.0 / self.s_per_byte if self.s_per_byte else None

    def as_fields(self) -> dict[str, float | None]:
        """The estimate as a batch record carries it."""
        g = self.goodput_bps
        return {"estimate_goodput_mbit_per_s": g / 1e6 if g else None,
                "estimate_rtt_ms": self.rtt_s * 1e3 if self.rtt_s is not None else None}


class LinkEstimator:
    """Goodput and RTT of the up direction, smoothed (weight ``alpha`` on the newest sample)."""

    def __init__(self, alpha: float = 0.4) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha is in (0, 1]")
        self.alpha = alpha
        self.estimate = LinkEstimate()
        self._rtts: collections.deque = collections.deque(maxlen=RTT_WINDOW)

    def observe(self, up_bytes: int, net_s: float, alpha: float | None = None) -> None:
        """One frame's time on the network (send to decoded reply, the peer's work taken out)."""
        e = self.estimate
        a = self.alpha if alpha is None else alpha
        net_s = max(1e-6, net_s)
        if up_bytes <= SMALL_FRAME_BYTES or e.rtt_s is None:
            self._rtts.append(net_s)
            e.rtt_s = min(self._rtts)
        if up_bytes >= LARGE_FRAME_BYTES:
            # A transfer faster than the smoothed RTT predicts is noise in the RTT, not an infinite
            # rate: floor the serialisation at a tenth of the sample.
            sample = math.log(max(net_s - e.rtt_s, 0.1 * net_s) / up_bytes)
            old = math.log(e.s_per_byte) if e.s_per_byte else sample
            e.s_per_byte = math.exp((1 - a) * old + a * sample)
        e.samples += 1

    def ready(self) -> bool:
        return self.estimate.rtt_s is not None and self.estimate.s_per_byte is not None


def self_profile(model: str, batch_size: int, timings: dict[str, Any], bytes_per_image: Sequence[int],
                 role: str, names: Sequence[str] | None = None, blocks: dict[int, int] | None = None) -> DeviceProfile:
    """A device profile from :func:`paretopipe.partition.stages.time_segments`: by default at block
    granularity (boundary k is block split k); with ``names`` (every boundary's) and ``blocks``
    (block split -> boundary), at the block cuts and the cuts of several tensors a run may choose,
    each boundary's bytes the sum of what crosses it. Codec costs are not timed in so brief a
    profile: they are zero here, and the link estimate, measured from real frames, carries what
    they cost on the wire."""
    n = len(bytes_per_image)
    names = list(names) if names is not None else [f"k{k}" for k in range(n)]
    blocks = blocks if blocks is not None else {k: k for k in range(n)}
    segs = timings["segment_compute_s"]
    if len(segs) != n - 1:
        raise UsageError(f"{role}'s self-profile has {len(segs)} segments for {n} block boundaries")
    rows = [{"encode_s": 0.0, "decode_s": 0.0, "frame_bytes": int(b) * batch_size, "wire_bytes": int(b) * batch_size,
             "loopback_transfer_s": 0.0} for b in bytes_per_image]
    doc = {"schema": SCHEMA, "model": model, "self_profile": True, "role": role,
           "boundaries": [{"index": i, "name": names[i], "bytes_per_image": int(b)}
                          for i, b in enumerate(bytes_per_image)],
           "blocks": {str(k): i for k, i in blocks.items()},
           "by_batch": {str(batch_size): {"segment_compute_s": list(segs), "whole_model_s": timings["whole_model_s"],
                                          "source_s": 0.0, "call_overhead_s": timings["call_overhead_s"],
                                          "codecs": {RESULT_CODEC: rows}}},
           "loopback": {"fixed_s": 0.0, "bytes_per_s": None},
           "method": {"repetitions": timings.get("repetitions"), "statistic": timings.get("statistic", "mean"),
                      "note": "self-profile at run start: block segments only, codecs not timed"}}
    return DeviceProfile(doc, f"{role}-self-profile")


#: A candidate split: a block index k, or the name of a cut (one where several tensors cross).
Candidate = int | str


def boundary_of(profile: DeviceProfile, candidate: Candidate) -> int | None:
    """Where ``candidate`` lies among ``profile``'s boundaries (``None``: the profile lacks it)."""
    if isinstance(candidate, str):
        return profile.boundaries.index(candidate) if candidate in profile.boundaries else None
    return profile.blocks.get(candidate)


@dataclasses.dataclass
class Choice:
    split: Candidate
    switched: bool
    predicted: dict[Candidate, float]   # candidate -> modelled latency (s) or throughput (img/s)


class SplitChooser:
    """Picks the split that minimises modelled latency (or maximises throughput) for the current
    link estimate, among block splits and, by name, cuts where several tensors cross (the cost
    model sums their bytes: the profiles' boundaries carry the sum). Hysteresis: a new split must
    beat the current one by ``margin`` (relative) on ``patience`` consecutive decisions, so noise
    in the estimate does not make it flap."""

    def __init__(self, profiles: Sequence[DeviceProfile], batch_size: int, candidates: Sequence[Candidate],
                 objective: str = "latency", codec: str = RESULT_CODEC, margin: float = 0.1,
                 patience: int = 2) -> None:
        if len(profiles) != 2:
            raise UsageError("the adaptive split chooses between two stages: give two device profiles")
        self.profiles, self.batch_size, self.codec = list(profiles), batch_size, codec
        self.objective, self.margin, self.patience = objective, margin, patience
        boundary = {k: boundary_of(profiles[0], k) for k in candidates}
        missing = [k for k in candidates if boundary[k] is None or boundary_of(profiles[1], k) != boundary[k]]
        if missing:
            raise UsageError(f"split {missing[0]} is not a boundary of these profiles (block splits "
                             f"0..{max(profiles[0].blocks)}; profile with --max-live for cuts of several tensors)")
        # In graph order, so ties go to the earlier split whatever the candidates' kinds.
        self.candidates = sorted(set(candidates), key=lambda k: boundary[k])
        self.boundary = {k: boundary[k] for k in self.candidates}
        self._streak: tuple[Candidate, int] | None = None

    def predict(self, k: Candidate, estimate: LinkEstimate) -> float:
        """Modelled latency (s) or throughput (img/s) of split ``k`` over the estimated link."""
        half = (estimate.rtt_s or 0.0) / 2
        up = LinkModel("estimate", Direction(delay_s=half, rate_bps=estimate.goodput_bps))
        down = LinkModel("estimate", Direction(delay_s=half))
        terms = chain_terms(self.profiles, [up], [self.boundary[k]], self.batch_size, self.codec, back_links=[down])
        return terms.latency_s() if self.objective == "latency" else terms.throughput_imgs_per_s()

    def _better(self, a: float, b: float) -> bool:
        """``a`` beats ``b`` by more than the margin."""
        if self.objective == "latency":
            return a < b * (1 - self.margin)
        return a > b * (1 + self.margin)

    def choose(self, current: Candidate | None, estimate: LinkEstimate) -> Choice:
        predicted = {k: self.predict(k, estimate) for k in self.candidates}
        pick = min if self.objective == "latency" else max
        best = pick(self.candidates, key=lambda k: predicted[k])
        if current is None or current not in predicted:
            self._streak = None
            return Choice(best, True, predicted)
        if best == current or not self._better(predicted[best], predicted[current]):
            self._streak = None
            return Choice(current, False, predicted)
        count = self._streak[1] + 1 if self._streak and self._streak[0] == best else 1
        self._streak = (best, count)
        if count >= self.patience:
            self._streak = None
            return Choice(best, True, predicted)
        return Choice(current, False, predicted)


@dataclasses.dataclass(frozen=True)
class VarianceSettings:
    """How a policy watches compute (``compute_tracker``): SCIoT's defaults."""

    ema_alpha: float = 0.2
    cv_threshold: float = 0.15
    window: int = 10


class AdaptivePolicy:
    """The adaptive split as a :class:`paretopipe.transport.policy.SplitPolicy`: a link estimate
    from the driver's observations, each stage's compute from its per-segment times
    (``compute_tracker``), a choice from the chooser with its hysteresis, and the probes the
    estimate needs when the chosen split's frames cannot show the rate (or the RTT).

    ``cut_of`` maps every candidate (and ``local``, the split that keeps all work on stage 1) to its
    cut's name; ``profiles_from`` turns stage 2's RUN_OK meta into the two device profiles, once;
    ``segments`` are the boundaries the stages time each segment between (None: compute is not
    watched, the profiles hold for the run)."""

    adaptive = True
    name = "adaptive"
    #: Ours: a segment a stage does not run follows the stage's observed speed (compute_tracker).
    speed_ratio = True

    def __init__(self, cut_of: dict[Candidate, str], candidates: Sequence[Candidate], local: Candidate,
                 profiles_from: Callable[[dict[str, Any]], list[DeviceProfile]], *, batch_size: int,
                 objective: str = "latency", codec: str = RESULT_CODEC,
                 summary: dict[str, Any] | None = None, segments: Sequence[str] | None = None,
                 variance: VarianceSettings = VarianceSettings(), seed: int = 0,
                 given_profiles: bool = False) -> None:
        self.cut_of, self.candidates, self.local = cut_of, list(candidates), local
        self.key_of = {cut: k for k, cut in cut_of.items()}
        self.profiles_from, self.batch_size = profiles_from, batch_size
        self.objective, self.codec = objective, codec
        self.segments = list(segments) if segments is not None else None
        self.variance, self.seed = variance, seed
        # Device profiles given for the run may be another machine's: the run's own first
        # observations are then the baseline each change is measured from.
        self.given_profiles = given_profiles
        self.estimator = LinkEstimator()
        self.chooser: SplitChooser | None = None
        self.tracker: ComputeTracker | None = None
        self._probing: set[int] = set()  # the stage-1 segments handed out as a compute probe
        self.free_choice = True
        self.last_rate_sample = self.last_rtt_sample = time.monotonic()
        self.notes = {"policy": self.name, "candidates": self.candidates, "objective": objective,
                      "variance": dataclasses.asdict(variance), **(summary or {})}

    def make_chooser(self, profiles: list[DeviceProfile]) -> SplitChooser:
        return SplitChooser(profiles, self.batch_size, self.candidates, self.objective, self.codec)

    def start(self, peer_meta: dict[str, Any]) -> None:
        # A stage 2 that came back starts from a free choice; the profiles are the first ones.
        if self.chooser is None:
            self.chooser = self.make_chooser(self.profiles_from(peer_meta))
            self.tracker = self._tracker(self.chooser.profiles)
        self.free_choice = True

    def _tracker(self, profiles: list[DeviceProfile]) -> ComputeTracker | None:
        if self.segments is None:
            return None
        base = [list(p.batch(self.batch_size)["segment_compute_s"]) for p in profiles]
        if any(len(b) != len(self.segments) - 1 for b in base):
            self.notes["compute_tracking"] = (f"off: the device profiles have {len(base[0])} segments, the run "
                                              f"{len(self.segments) - 1} (profile with the run's boundaries)")
            self.segments = None
            return None
        v = self.variance
        return ComputeTracker(base, alpha=v.ema_alpha, cv_threshold=v.cv_threshold, window=v.window,
                              speed_ratio=self.speed_ratio, relative=self.given_profiles)

    def _refresh_profiles(self) -> None:
        """The chooser's profiles take the tracker's estimates (read per decision by the cost model)."""
        if self.tracker is None or self.chooser is None:
            return
        for stage, profile in enumerate(self.chooser.profiles):
            profile.batch(self.batch_size)["segment_compute_s"][:] = self.tracker.estimates(stage)

    def observe_compute(self, seq: int, stage: int, first: int, times: Sequence[float]) -> None:
        if self.tracker is not None:
            self.tracker.observe(seq, stage, first, times)

    def reprofiles_due(self) -> Sequence[tuple[int, str]]:
        if self.tracker is None:
            return ()
        probe = COMPUTE_PROBE_INTERVAL_S if self.speed_ratio else None
        due = self.tracker.due(probe)
        self._probing = {r.segment for r in due if r.probe}
        return [(r.segment, r.why) for r in due]

    def reprofiled(self, seq: int, first: int, times: Sequence[float], whys: Sequence[str]) -> None:
        if self.tracker is not None:
            probe = all(j in self._probing for j in range(first, first + len(times)))
            self.tracker.reprofiled(seq, 0, first, times, whys, probe=probe)

    def stage2_probed(self, seq: int, first: int, times: Sequence[float]) -> None:
        if self.tracker is not None:
            why = f"compute probe: no span of stage 2 sampled its speed for {COMPUTE_PROBE_INTERVAL_S:g} s"
            self.tracker.reprofiled(seq, 1, first, times, [why] * len(times), "compute probe on stage 2", probe=True)

    def stage2_probes_due(self) -> Sequence[tuple[int, int]]:
        """Ours: a stage 2 whose speed no span sampled for a second (it ran nothing, or only a short
        tail) times its first ones (from the model's input, on a synthetic batch), so its speed is
        known while all or most of the work stays on stage 1."""
        if self.tracker is None or not self.speed_ratio:
            return ()
        due = self.tracker.probe_due(1, COMPUTE_PROBE_INTERVAL_S)
        return [(0, due)] if due else ()

    def startup_probes(self) -> Sequence[int]:
        self.last_rate_sample = self.last_rtt_sample = time.monotonic()
        return [0] * STARTUP_PINGS + [PROBE_BYTES] * STARTUP_PROBES

    def cuts_for(self, seq: int, current: list[str] | None) -> tuple[list[str], dict[str, Any]]:
        est = self.estimator.estimate
        fields: dict[str, Any] = est.as_fields()
        split = self.local
        if current is not None and self.chooser is not None:
            self._refresh_profiles()
            split = self.decide(current, est, fields)
        if self.tracker is not None:
            fields.update(compute_ratio_stage1=round(self.tracker.ratio(0), 4),
                          compute_ratio_stage2=round(self.tracker.ratio(1), 4),
                          reprofiles=self.tracker.reprofiles)
        # A batch record holds numbers only: a cut of several tensors is its place among the candidates.
        fields.update(split_k=split if isinstance(split, int) else None,
                      split_candidate=self.candidates.index(split) if split in self.candidates else None)
        return [self.cut_of[split]], fields

    def decide(self, current: list[str], est: LinkEstimate, fields: dict[str, Any]) -> Candidate:
        """The split of the next batch: the chooser's, with its hysteresis (the first choice on a
        connection is free)."""
        before = None if self.free_choice else self.key_of.get(current[0])
        choice = self.chooser.choose(before, est)
        self.free_choice = False
        fields["predicted_s" if self.objective == "latency" else "predicted_imgs_per_s"] = choice.predicted[choice.split]
        return choice.split

    def observe(self, up_bytes: int, net_s: float, kind: str) -> None:
        now = time.monotonic()
        if kind == "probe":
            self.estimator.observe(up_bytes, net_s, PROBE_ALPHA)
            self.last_rate_sample = now
            return
        self.estimator.observe(up_bytes, net_s)
        if kind == "ping":
            self.last_rtt_sample = now
        elif kind == "result":  # a batch that met its deadline shows the rate, or the RTT, by its size
            if up_bytes >= LARGE_FRAME_BYTES:
                self.last_rate_sample = now
            elif up_bytes <= SMALL_FRAME_BYTES:
                self.last_rtt_sample = now

    def probes_due(self, now: float) -> Sequence[int]:
        """A rate probe when the split's frames are too small to show the rate, a ping when they
        are too large to show the RTT."""
        return [size for size, last in ((PROBE_BYTES, self.last_rate_sample), (0, self.last_rtt_sample))
                if now - last >= PROBE_INTERVAL_S]

    def summary(self) -> dict[str, Any]:
        out = dict(self.notes)
        if self.tracker is not None:
            out["compute"] = self.tracker.summary()
        return out


class SciotPolicy(AdaptivePolicy):
    """SCIoT's decision rule on the same runtime (Bove and Bedogni, CCNC and SEC 2024): every
    batch takes the split the estimates make fastest, with no hysteresis; a segment a stage does
    not run keeps its last estimate; and with probability ``local_probability`` (seeded) a batch
    is forced whole onto stage 1, which refreshes all of stage 1's times. The link estimate, the
    cost model and the variance detection are the ones the adaptive policy uses, so the two
    policies differ in their rule alone."""

    name = "sciot"
    speed_ratio = False

    def __init__(self, *args: Any, local_probability: float = 0.1, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.local_probability = local_probability
        self.rng = random.Random(f"{self.seed}/sciot")
        self.forced = 0
        self.notes["local_probability"] = local_probability

    def make_chooser(self, profiles: list[DeviceProfile]) -> SplitChooser:
        return SplitChooser(profiles, self.batch_size, self.candidates, self.objective, self.codec,
                            margin=0.0, patience=1)

    def decide(self, current: list[str], est: LinkEstimate, fields: dict[str, Any]) -> Candidate:
        if self.rng.random() < self.local_probability:
            self.forced += 1
            self.notes["forced_local"] = self.forced
            fields["forced_local"] = True
            return self.local
        return super().decide(current, est, fields)
