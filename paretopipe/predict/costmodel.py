"""The cost model: device profiles + links -> modelled latency and throughput of a split.

For a chain of N stages (device 1 is the data source and receives the result back):

    latency    = stage-1 compute + encode
                 + for each hop: link time(frame) + decode + next stage's compute + encode
                 + the result's way back (each hop's down direction) + result decode
    link time  = expected delay + frame bits / rate (+ expected loss retransmits)
                 + the transport beneath (fixed + bytes / bytes_per_s)
    throughput = batch / max(source + stage-1 work, each link's busy time, each later stage's work)

These are the two ideal operating points: one batch alone in the pipeline (latency) and a
pipeline kept full (throughput). A measured run with a window of W batches sits between them;
:func:`simulate` replays the TCP backend's protocol with the same terms to predict exactly what
such a run measures. Every number here is modelled, never measured; field names carry
``predicted_``. The arithmetic of one link direction is :class:`~paretopipe.network.conditions.Direction`'s,
and the replay uses the emulated link's own :class:`~paretopipe.network.emulated.LinkSchedule`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from ..errors import UsageError
from ..network.conditions import Direction, NetworkConditions
from ..network.emulated import LinkSchedule
from .device_profile import RESULT_CODEC, DeviceProfile, split_codec
from ..records import throughput_window

# The last stage sends its own durations in each result frame's JSON meta (see transport/tcp/sink.py).
RESULT_META_BYTES = len(json.dumps({k: 0.012345678901234567 for k in (
    "stage2_decode_s", "stage2_queue_s", "stage2_compute_s", "stage2_encode_s")}, separators=(",", ":")))
#: A sealed frame's authentication tag (transport.aead.TAG_BYTES; this module imports no transport).
TAG_BYTES = 16


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """One direction of a link: shaping (a :class:`Direction`) over a transport beneath."""

    name: str = "link"
    direction: Direction = Direction()
    base_fixed_s: float = 0.0
    base_bytes_per_s: float | None = None

    @classmethod
    def of(cls, name: str = "link", base_fixed_s: float = 0.0, base_bytes_per_s: float | None = None,
           **direction: Any) -> "LinkModel":
        """A link from :class:`Direction` fields: ``LinkModel.of(delay_s=0.02, rate_bps=8e6)``."""
        return cls(name, Direction(**direction), base_fixed_s, base_bytes_per_s)

    @classmethod
    def pair(cls, conditions: NetworkConditions, base: dict[str, Any] | None = None) -> tuple["LinkModel", "LinkModel"]:
        """(up, down) models of ``conditions`` over the transport ``base`` (fixed_s, bytes_per_s)."""
        base = base or {}
        fixed, rate = float(base.get("fixed_s") or 0.0), base.get("bytes_per_s")
        if conditions.up.trace or conditions.down.trace:
            # A constant-rate model of a varying link would print a number that is not true.
            raise UsageError(f"network {conditions.name!r} follows a rate trace, which the cost model does not "
                             f"model; predict with constant-rate conditions (e.g. --rate at the trace's mean)")
        return (cls(conditions.name, conditions.up, fixed, rate), cls(conditions.name, conditions.down, fixed, rate))

    def with_rate(self, rate_bps: float | None) -> "LinkModel":
        return dataclasses.replace(self, direction=dataclasses.replace(self.direction, rate_bps=rate_bps))

    def expected_delay_s(self) -> float:
        return self.direction.expected_delay_s()

    def serialise_s(self, nbytes: int) -> float:
        """Time the shaped link is busy with ``nbytes``, expected retransmits included."""
        return self.direction.serialise_s(nbytes, self.direction.expected_lost_segments(nbytes))

    def base_s(self, nbytes: int) -> float:
        """The transport beneath the shaping: writing the bytes through the real socket."""
        return self.base_fixed_s + (nbytes / self.base_bytes_per_s if self.base_bytes_per_s else 0.0)

    def time_s(self, nbytes: int) -> float:
        return self.serialise_s(nbytes) + self.expected_delay_s() + self.base_s(nbytes)

    def busy_s(self, nbytes: int) -> float:
        """How long the link is occupied per message when messages queue back to back."""
        return max(self.serialise_s(nbytes), self.base_s(nbytes))


@dataclasses.dataclass(frozen=True)
class StagePart:
    """What one stage costs per batch: its compute, its outgoing frame's encode and size (the last
    stage's: the result), and its incoming frame's decode (the first stage's: the returned result)."""

    compute_s: float
    encode_s: float
    decode_s: float
    out_bytes: int
    memory_bytes: int | None = None  # its parameters and buffers plus its largest activation


def stage_part(profile: DeviceProfile, batch_size: int, j: int, n: int, start: int, stop: int,
               codec: str) -> StagePart:
    """Stage ``j`` of ``n``, running boundaries ``start``..``stop`` on ``profile``'s device. A sealed
    ``codec`` (``float32/none+aesgcm``) adds opening the incoming frame to its decode and sealing
    the outgoing one to its encode (each the profile's own per-frame cipher timing), and the tag to
    every frame."""
    codec, cipher = split_codec(codec)
    last = len(profile.boundaries) - 1
    compute = profile.stage_compute_s(batch_size, start, stop)
    memory = profile.stage_memory_bytes(batch_size, start, stop)
    incoming = profile.codec(batch_size, last, RESULT_CODEC) if j == 0 else profile.codec(batch_size, start, codec)
    if j == n - 1:
        out = profile.codec(batch_size, last, RESULT_CODEC)
        out_bytes = out["frame_bytes"] + RESULT_META_BYTES
    else:
        out = profile.codec(batch_size, stop, codec)
        out_bytes = out["frame_bytes"]
    if cipher == "none":
        return StagePart(compute, out["encode_s"], incoming["decode_s"], out_bytes, memory)
    return StagePart(compute, out["encode_s"] + profile.cipher_s(cipher, "seal", out_bytes),
                     incoming["decode_s"] + profile.cipher_s(cipher, "open", incoming["frame_bytes"]),
                     out_bytes + TAG_BYTES, memory)


def latency_piece(j: int, n: int, part: StagePart, link_out: LinkModel | None, tail_s: float) -> float:
    """Stage ``j``'s share of one batch's latency: its incoming decode (j > 0), compute, encode and
    the hop out; the last stage adds ``tail_s``, the result's way back and its decode at stage 1."""
    own = part.compute_s + part.encode_s + (part.decode_s if j > 0 else 0.0)
    if j < n - 1:
        return own + link_out.time_s(part.out_bytes)
    return own + tail_s


def busy_pieces(j: int, n: int, part: StagePart, link_out: LinkModel | None, source_s: float) -> dict[str, float]:
    """Per-batch busy time of stage ``j``'s core and of its outgoing link."""
    work = part.decode_s + part.compute_s + part.encode_s + (source_s if j == 0 else 0.0)
    out = {f"stage{j + 1}": work}
    if j < n - 1:
        out[f"link{j + 1}"] = link_out.busy_s(part.out_bytes)
    return out


@dataclasses.dataclass
class ChainTerms:
    """Every term of one plan: N stages, N - 1 forward links, the result's way back."""

    batch_size: int
    source_s: float
    parts: list[StagePart]
    links: list[LinkModel]            # forward (up) direction of hop j
    back_links: list[LinkModel]       # the way back (down) of hop j, same indexing

    @property
    def stages(self) -> int:
        return len(self.parts)

    @property
    def result_bytes(self) -> int:
        return self.parts[-1].out_bytes

    @property
    def compute_s(self) -> list[float]:
        return [p.compute_s for p in self.parts]

    @property
    def frame_bytes(self) -> list[int]:
        return [p.out_bytes for p in self.parts[:-1]]

    def forward_link_s(self) -> list[float]:
        return [link.time_s(p.out_bytes) for link, p in zip(self.links, self.parts)]

    def return_link_s(self) -> list[float]:
        return [link.time_s(self.result_bytes) for link in reversed(self.back_links)]

    def tail_s(self) -> float:
        return sum(self.return_link_s()) + self.parts[0].decode_s

    def latency_s(self) -> float:
        n, tail = self.stages, self.tail_s()
        return sum(latency_piece(j, n, p, self.links[j] if j < n - 1 else None, tail)
                   for j, p in enumerate(self.parts))

    def busy_terms(self) -> dict[str, float]:
        """Per-batch busy time of every resource that must serve every batch."""
        n, terms = self.stages, {}
        for j, p in enumerate(self.parts):
            terms.update(busy_pieces(j, n, p, self.links[j] if j < n - 1 else None, self.source_s))
        for j, link in enumerate(self.back_links, start=1):
            terms[f"return{j}"] = link.busy_s(self.result_bytes)
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
        for j, p in enumerate(self.parts):
            row[f"predicted_stage{j + 1}_compute_s"] = p.compute_s
        for j, t in enumerate(self.forward_link_s(), start=1):
            row[f"predicted_link{j}_s"] = t
        row["predicted_return_s"] = sum(self.return_link_s())
        row["predicted_codec_s"] = sum(p.encode_s + p.decode_s for p in self.parts)
        frames = self.frame_bytes
        row["frame_bytes"] = frames[0] if len(frames) == 1 else list(frames)
        if all(p.memory_bytes is not None for p in self.parts):
            for j, p in enumerate(self.parts):
                row[f"predicted_memory_stage{j + 1}_bytes"] = p.memory_bytes
            row["predicted_memory_bytes"] = max(p.memory_bytes for p in self.parts)
        return row

    def energy_modelled_per_image_j(self, core_w: Sequence[float | None]) -> float | None:
        """Each stage's compute x the watts one busy core adds on its device, per image: the
        modelled net energy (None unless every device declares its power)."""
        if len(core_w) != self.stages or any(w is None for w in core_w):
            return None
        return sum(p.compute_s * w for p, w in zip(self.parts, core_w)) / self.batch_size


def chain_terms(profiles: Sequence[DeviceProfile], links: Sequence[LinkModel], cuts: Sequence[int],
                batch_size: int, codec: str = "float32/none",
                back_links: Sequence[LinkModel] | None = None) -> ChainTerms:
    """The terms of running ``profiles[j]``'s stage j, cut at boundary indices ``cuts``.
    ``back_links[j]`` is hop j's way back (default: the same model as the way there)."""
    n = len(profiles)
    if len(cuts) != n - 1 or len(links) != n - 1:
        raise ValueError(f"{n} devices need {n - 1} cuts and {n - 1} links")
    last = len(profiles[0].boundaries) - 1
    bounds = [0, *cuts, last]
    if any(a > b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cuts must be in order, got {list(cuts)}")
    parts = [stage_part(p, batch_size, j, n, a, b, codec)
             for j, (p, a, b) in enumerate(zip(profiles, bounds, bounds[1:]))]
    return ChainTerms(batch_size=batch_size, source_s=profiles[0].source_s(batch_size), parts=parts,
                      links=list(links), back_links=list(back_links if back_links is not None else links))


# -- replaying the TCP protocol ------------------------------------------------------------------
class _LinkSim:
    """The emulated link (its own schedule, with expected delay and loss) plus its sender thread."""

    def __init__(self, link: LinkModel) -> None:
        self.link = link
        self.schedule = LinkSchedule(link.direction)
        self.sender_free = 0.0

    def deliver(self, submitted: float, nbytes: int) -> float:
        d = self.link.direction
        arrival = self.schedule.deliver(submitted, nbytes, d.expected_delay_s(), d.expected_lost_segments(nbytes))
        self.sender_free = max(arrival, self.sender_free) + self.link.base_s(nbytes)
        return self.sender_free


def simulate(terms: ChainTerms, num_batches: int, warmup: int, in_flight: int) -> dict[str, float | None]:
    """What a TCP-backend run with this protocol measures, with every duration taken from ``terms``.

    Stage 1 generates a batch, waits for a free slot in the window, stamps the start, computes and
    hands the frame to its sender; each later stage decodes and computes it; the result comes back
    the same way and stamps the end. A stage's threads share its core, so each stage is one
    server (stage 1 also pays for decoding results). Summarised like records.summarize: median
    latency of the measured batches, and measured images over the measured window.
    """
    n, parts = terms.stages, terms.parts
    fwd = [_LinkSim(link) for link in terms.links]
    back = [_LinkSim(link) for link in reversed(terms.back_links)]
    source_free = 0.0
    stage_free = [0.0] * n
    starts: list[float] = []
    ends: list[float] = []
    for seq in range(warmup + num_batches):
        generated = source_free + terms.source_s
        slot = ends[seq - in_flight] if seq >= in_flight else 0.0
        start = max(generated, slot)
        t = start + parts[0].compute_s + parts[0].encode_s
        source_free = t + parts[0].decode_s
        for j in range(1, n):
            t = fwd[j - 1].deliver(t, parts[j - 1].out_bytes)
            t = stage_free[j] = max(t, stage_free[j]) + parts[j].decode_s + parts[j].compute_s + parts[j].encode_s
        for sim in back:
            t = sim.deliver(t, terms.result_bytes)
        starts.append(start)
        ends.append(t + parts[0].decode_s)
    lat = sorted(e - s for e, s in zip(ends[warmup:], starts[warmup:]))
    if not lat:
        return {"predicted_latency_s": None, "predicted_throughput_imgs_per_s": None}
    median = (lat[(len(lat) - 1) // 2] + lat[len(lat) // 2]) / 2
    items, window = throughput_window(starts[warmup:], ends[warmup:])
    return {"predicted_latency_s": median,
            "predicted_throughput_imgs_per_s": items * terms.batch_size / window if window else None}
