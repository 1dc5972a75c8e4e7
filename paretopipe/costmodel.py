"""The cost model: per-device profiles + links -> modelled latency and throughput of a split.

For a chain of N stages (device 1 is the data source and receives the result back):

    latency    = stage-1 compute + encode
                 + for each link: link time(frame) + decode + next stage's compute + encode
                 + the result's way back (each link, reversed) + result decode
    link time  = expected delay + frame bits / rate (+ expected loss retransmits)
                 + the transport beneath (fixed + bytes / bytes_per_s)
    throughput = batch / max(source + stage-1 work, each link's busy time, each later stage's work)

These are the two ideal operating points: one batch alone in the pipeline (latency) and a
pipeline kept full (throughput). A measured run with a window of W batches sits between them;
:func:`simulate` replays the TCP backend's protocol with the same terms to predict exactly what
such a run measures (median latency of the measured batches, items over the measured window).
Every number here is modelled, never measured; field names carry ``predicted_``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

from .link import MSS_BYTES, Profile
from .profile import RESULT_CODEC, DeviceProfile

# Stage 2 sends its own durations in each result frame's JSON meta (see backends/tcp.py).
RESULT_META_BYTES = len(json.dumps({k: 0.012345678901234567 for k in (
    "stage2_decode_s", "stage2_queue_s", "stage2_compute_s", "stage2_encode_s")}, separators=(",", ":")))


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """One direction of a link: shaping (delay, jitter, loss, rate) over a transport beneath."""

    name: str = "link"
    delay_s: float = 0.0
    jitter_s: float = 0.0
    distribution: str = "normal"
    loss_percent: float = 0.0
    rate_bps: float | None = None
    base_fixed_s: float = 0.0
    base_bytes_per_s: float | None = None

    @classmethod
    def from_profile(cls, profile: Profile, base: dict[str, Any] | None = None) -> "LinkModel":
        base = base or {}
        return cls(name=profile.name, delay_s=profile.delay_s, jitter_s=profile.jitter_s,
                   distribution=profile.distribution, loss_percent=profile.loss_percent,
                   rate_bps=profile.rate_bps, base_fixed_s=float(base.get("fixed_s") or 0.0),
                   base_bytes_per_s=base.get("bytes_per_s"))

    def with_rate(self, rate_bps: float | None) -> "LinkModel":
        return dataclasses.replace(self, rate_bps=rate_bps)

    def expected_delay_s(self) -> float:
        """E[max(0, delay + jitter)]: the emulator and netem never deliver before sending."""
        d, j = self.delay_s, self.jitter_s
        if not j:
            return d
        if self.distribution == "uniform":  # jitter ~ U(-j, j)
            lo, hi = d - j, d + j
            if lo >= 0:
                return d
            return max(hi, 0.0) ** 2 / (2 * (hi - lo))
        # normal (and, as an approximation, the pareto mixes): jitter ~ N(0, j)
        z = d / j
        return d * 0.5 * (1 + math.erf(z / math.sqrt(2))) + j * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    def serialise_s(self, nbytes: int) -> float:
        """Time the shaped link is busy with ``nbytes``, expected retransmits included."""
        seg_s = MSS_BYTES * 8 / self.rate_bps if self.rate_bps else 0.0
        ser = nbytes * 8 / self.rate_bps if self.rate_bps else 0.0
        if self.loss_percent:
            segments = max(1, math.ceil(nbytes / MSS_BYTES))
            ser += segments * self.loss_percent / 100 * (seg_s + 2 * self.delay_s)
        return ser

    def base_s(self, nbytes: int) -> float:
        """The transport beneath the shaping: writing the bytes through the real socket."""
        return self.base_fixed_s + (nbytes / self.base_bytes_per_s if self.base_bytes_per_s else 0.0)

    def time_s(self, nbytes: int) -> float:
        return self.serialise_s(nbytes) + self.expected_delay_s() + self.base_s(nbytes)

    def busy_s(self, nbytes: int) -> float:
        """How long the link is occupied per message when messages queue back to back."""
        return max(self.serialise_s(nbytes), self.base_s(nbytes))


@dataclasses.dataclass
class ChainTerms:
    """Every term of one plan: N stages, N - 1 forward links, the result's way back."""

    batch_size: int
    source_s: float
    compute_s: list[float]
    encode_s: list[float]             # stage j's outgoing frame (the last stage: the result)
    decode_s: list[float]             # stage j's incoming frame (stage 0: the returned result)
    frame_bytes: list[int]            # forward link j
    result_frame_bytes: int
    links: list[LinkModel]

    @property
    def stages(self) -> int:
        return len(self.compute_s)

    def forward_link_s(self) -> list[float]:
        return [link.time_s(n) for link, n in zip(self.links, self.frame_bytes)]

    def return_link_s(self) -> list[float]:
        return [link.time_s(self.result_frame_bytes) for link in reversed(self.links)]

    def latency_s(self) -> float:
        total = self.compute_s[0] + self.encode_s[0]
        for j, t in enumerate(self.forward_link_s(), start=1):
            total += t + self.decode_s[j] + self.compute_s[j] + self.encode_s[j]
        return total + sum(self.return_link_s()) + self.decode_s[0]

    def busy_terms(self) -> dict[str, float]:
        """Per-batch busy time of every resource that must serve every batch."""
        terms = {"stage1": self.source_s + self.compute_s[0] + self.encode_s[0] + self.decode_s[0]}
        for j, (link, n) in enumerate(zip(self.links, self.frame_bytes), start=1):
            terms[f"link{j}"] = link.busy_s(n)
            terms[f"stage{j + 1}"] = self.decode_s[j] + self.compute_s[j] + self.encode_s[j]
            terms[f"return{j}"] = link.busy_s(self.result_frame_bytes)
        return terms

    def bottleneck(self) -> tuple[str, float]:
        name, value = max(self.busy_terms().items(), key=lambda kv: kv[1])
        return name, value

    def throughput_imgs_per_s(self) -> float:
        return self.batch_size / self.bottleneck()[1]

    def as_row(self) -> dict[str, Any]:
        name, busy = self.bottleneck()
        row: dict[str, Any] = {"predicted_latency_s": self.latency_s(),
                               "predicted_throughput_imgs_per_s": self.batch_size / busy,
                               "predicted_bottleneck": name, "predicted_source_s": self.source_s}
        for j in range(self.stages):
            row[f"predicted_stage{j + 1}_compute_s"] = self.compute_s[j]
        for j, t in enumerate(self.forward_link_s(), start=1):
            row[f"predicted_link{j}_s"] = t
        row["predicted_return_s"] = sum(self.return_link_s())
        row["predicted_codec_s"] = sum(self.encode_s) + sum(self.decode_s)
        row["frame_bytes"] = self.frame_bytes[0] if len(self.frame_bytes) == 1 else list(self.frame_bytes)
        return row


def chain_terms(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], cuts: Sequence[int],
                batch_size: int, codec: str = "float32/none") -> ChainTerms:
    """The terms of running ``profiles[j]``'s stage j, cut at boundary indices ``cuts``."""
    n = len(profiles)
    if len(cuts) != n - 1 or len(links) != n - 1:
        raise ValueError(f"{n} devices need {n - 1} cuts and {n - 1} links")
    last = len(profiles[0].boundaries) - 1
    bounds = [0, *cuts, last]
    if any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cuts must be in order, got {list(cuts)}")
    compute = [p.stage_compute_s(batch_size, a, b) for p, a, b in zip(profiles, bounds, bounds[1:])]
    fwd = [profiles[j].codec(batch_size, bounds[j + 1], codec) for j in range(n - 1)]
    arrive = [profiles[j].codec(batch_size, bounds[j], codec) for j in range(1, n)]
    result_out = profiles[-1].codec(batch_size, last, RESULT_CODEC)
    result_in = profiles[0].codec(batch_size, last, RESULT_CODEC)
    return ChainTerms(batch_size=batch_size, source_s=profiles[0].source_s(batch_size),
                      compute_s=compute,
                      encode_s=[row["encode_s"] for row in fwd] + [result_out["encode_s"]],
                      decode_s=[result_in["decode_s"]] + [row["decode_s"] for row in arrive],
                      frame_bytes=[row["frame_bytes"] for row in fwd],
                      result_frame_bytes=result_out["frame_bytes"] + RESULT_META_BYTES,
                      links=list(links))


# -- replaying the TCP protocol ------------------------------------------------------------------
class _LinkSim:
    """The emulated link plus its sender thread (see link.EmulatedLink and link.LinkSender)."""

    def __init__(self, link: LinkModel) -> None:
        self.link = link
        self.busy_until = self.last_arrival = self.sender_free = 0.0

    def deliver(self, submitted: float, nbytes: int) -> float:
        start = max(submitted, self.busy_until)
        self.busy_until = start + self.link.serialise_s(nbytes)
        arrival = max(self.busy_until + self.link.expected_delay_s(), self.last_arrival)
        self.last_arrival = arrival
        self.sender_free = max(arrival, self.sender_free) + self.link.base_s(nbytes)
        return self.sender_free


def simulate(terms: ChainTerms, num_batches: int, warmup: int, in_flight: int) -> dict[str, float | None]:
    """What a TCP-backend run with this protocol measures, with every duration taken from ``terms``.

    Stage 1 generates a batch, waits for a free slot in the window, stamps the start, computes and
    hands the frame to its sender; each later stage decodes and computes it; the result comes back
    the same way and stamps the end. A stage's threads share its core, so each stage is one
    server (stage 1 also pays for decoding results). Summarised like records.summarize: median
    latency of the measured batches, and measured images over the window from the last warm-up
    completion to the last completion.
    """
    n = terms.stages
    fwd = [_LinkSim(link) for link in terms.links]
    back = [_LinkSim(link) for link in reversed(terms.links)]
    source_free = 0.0
    stage_free = [0.0] * n
    starts: list[float] = []
    ends: list[float] = []
    for seq in range(warmup + num_batches):
        generated = source_free + terms.source_s
        slot = ends[seq - in_flight] if seq >= in_flight else 0.0
        start = max(generated, slot)
        t = start + terms.compute_s[0] + terms.encode_s[0]
        source_free = t + terms.decode_s[0]
        for j in range(1, n):
            t = fwd[j - 1].deliver(t, terms.frame_bytes[j - 1])
            t = stage_free[j] = max(t, stage_free[j]) + terms.decode_s[j] + terms.compute_s[j] + terms.encode_s[j]
        for sim in back:
            t = sim.deliver(t, terms.result_frame_bytes)
        starts.append(start)
        ends.append(t + terms.decode_s[0])
    lat = sorted(e - s for e, s in zip(ends[warmup:], starts[warmup:]))
    if not lat:
        return {"predicted_latency_s": None, "predicted_throughput_imgs_per_s": None}
    begin = max(ends[:warmup]) if warmup else min(starts[warmup:])
    window = max(ends[warmup:]) - begin
    median = (lat[(len(lat) - 1) // 2] + lat[len(lat) // 2]) / 2
    return {"predicted_latency_s": median,
            "predicted_throughput_imgs_per_s": num_batches * terms.batch_size / window if window > 0 else None}
