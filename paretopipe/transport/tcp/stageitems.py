"""What a later TCP stage computes, by workload: image batches (an activation checked against the
cut it crossed, int8 and int4 parts dequantised off the compute thread) or a generation's steps
(each step's place in its stream checked, token ids or a hidden state decoded). ``tcp.sink`` asks
its items what to do with a frame instead of asking which workload it has; :func:`stage_items`
is where that is decided, once per run."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ...errors import UsageError, WireError
from ...llm.summary import finish_record
from ...partition import wirequant
from ...partition.activation import Activation
from ...partition.stages import StageBuilder, StageTimer
from .. import wire
from ..generation import STEP_META, GenerationStage
from ..runconfig import RunConfig


class StageItems(Protocol):
    """A later stage's items (``stage``: the module it starts the run with; ``codec_dtype``: the
    dtype its codec is told the activations it sends on have)."""

    stage: Any
    codec_dtype: str

    def decode(self, f: wire.Frame) -> tuple[Any, float]:
        """On the reader thread: the frame's input, checked (None: the frame's own tensor), and the
        seconds decoding it took beyond the frame's."""

    def forward(self, f: wire.Frame, x: Any, stage: Any) -> tuple[Any, float]:
        """On the compute thread: the output and its compute seconds."""

    def onward(self, f: wire.Frame, out: Any) -> tuple[Any, dict[str, Any] | None]:
        """A middle stage's output as the next stage takes it: the payload's tensors and the meta."""

    def result(self, f: wire.Frame, out: Any) -> tuple[wire.Payload, dict[str, Any]]:
        """The last stage's result: its payload and what the meta adds."""

    def relayed(self, meta: dict[str, Any] | None) -> dict[str, Any]:
        """What a middle stage passes back unchanged from a later stage's result."""

    def switched(self, incoming: str) -> None:
        """An adaptive run's SWITCH: what crosses into this stage is now ``incoming``'s."""

    def engine(self) -> dict[str, Any] | None:
        """The engine this stage computes on, for its manifest (None: it has none of its own)."""

    def part(self, sequences: Any) -> dict[str, Any]:
        """What this workload adds to the stage's part of the record (sent on too)."""

    def finish_record(self, record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> None:
        """The record's workload figures once the stage that writes it has built it."""


def stage_items(builder: Any, cfg: RunConfig, index: int) -> StageItems:
    """Stage ``index``'s items for this run's workload."""
    if cfg.workload.generates:
        return GenerationItems(builder, cfg, index)
    return ImageItems(builder, cfg, index)


class ImageItems:
    """Image batches: the activation each frame carries is checked against what crosses the cut
    before any of it is decoded; quantised parts are dequantised on the reader thread."""

    def __init__(self, builder: StageBuilder, cfg: RunConfig, index: int) -> None:
        self.builder, self.cfg, self.index = builder, cfg, index
        self.codec_dtype = cfg.wire_dtype
        self.stage = builder.stage_for(cfg, index)
        self.timer = StageTimer(builder.device)
        self.switched(cfg.cuts[index - 1])
        odd = [d for _, d in self.expected if d != "float32"]
        if cfg.wire_dtype in wirequant.QUANTISED and odd:
            raise UsageError(f"--wire-dtype {cfg.wire_dtype} quantises float32 activations; the cut "
                             f"{self.incoming} also carries {', '.join(odd)}: use float32, float16 or bfloat16")

    def switched(self, incoming: str) -> None:
        self.incoming = incoming
        self.expected = self.builder.partitioner.live_specs(incoming)

    def decode(self, f: wire.Frame) -> tuple[Activation | None, float]:
        if self.cfg.wire_dtype in wirequant.QUANTISED:
            return wirequant.timed(self._checked, f)
        self._checked(f)
        return None, 0.0

    def _checked(self, f: wire.Frame) -> Activation:
        dtype = self.cfg.wire_dtype
        groups = wirequant.grouped(f.tensor, dtype)
        got = [(wirequant.decoded_shape(g, dtype)[1:], str(g[0].dtype).removeprefix("torch.")
                if dtype not in wirequant.QUANTISED else "float32") for g in groups]
        if got != self.expected:
            raise WireError(f"batch {f.seq} carries {described(got)}; what crosses {self.incoming} is "
                            f"{described(self.expected)}")
        return wirequant.decode_activation(groups, dtype)

    def forward(self, f: wire.Frame, x: Any, stage: Any) -> tuple[Any, float]:
        return self.timer.run(stage, f.tensor if x is None else x, self.builder.device)

    def onward(self, f: wire.Frame, out: Any) -> tuple[Any, dict[str, Any] | None]:
        return wirequant.encode_activation(out, self.cfg.wire_dtype), None

    def result(self, f: wire.Frame, out: Any) -> tuple[wire.Payload, dict[str, Any]]:
        return wire.encode_payload(out), {}

    def relayed(self, meta: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    def engine(self) -> dict[str, Any] | None:
        return self.builder.engine_of(self.cfg, self.index)

    def part(self, sequences: Any) -> dict[str, Any]:
        return {}

    def finish_record(self, record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> None:
        pass  # an image run's summary is whole as built


class GenerationItems:
    """A generation's steps: each names its stream, start and step (checked on arrival and again
    where it is computed), its tensor is token ids or a hidden state, and the last stage returns a
    token. Its activations go on as float32 to the codec: the wire dtype is applied by the cut's
    own encoding."""

    codec_dtype = "float32"

    def __init__(self, builder: Any, cfg: RunConfig, index: int) -> None:
        self.gen = GenerationStage(builder, cfg, index)
        self.stage = self.gen.stage

    def switched(self, incoming: str) -> None:
        raise WireError("a generation's split does not move during a run")

    def decode(self, f: wire.Frame) -> tuple[Any, float]:
        return self.gen.stage_input(f.seq, f.tensor, self.gen.step_of(f.seq, f.meta)[1]), 0.0

    def forward(self, f: wire.Frame, x: Any, stage: Any) -> tuple[Any, float]:
        stream, start, _ = self.gen.step_of(f.seq, f.meta)
        return self.gen.forward(f.seq, stream, x, start)

    def onward(self, f: wire.Frame, out: Any) -> tuple[Any, dict[str, Any] | None]:
        return self.gen.encode(out), {k: f.meta[k] for k in STEP_META}  # the step's place goes on

    def result(self, f: wire.Frame, out: Any) -> tuple[wire.Payload, dict[str, Any]]:
        stream, _, step = self.gen.step_of(f.seq, f.meta)
        return wire.encode_payload(None), {"stream": stream, "token": self.gen.choose(out, stream, step)}

    def relayed(self, meta: dict[str, Any] | None) -> dict[str, Any]:
        return {k: (meta or {}).get(k) for k in ("stream", "token")}  # stage 1 checks them

    def engine(self) -> dict[str, Any] | None:
        return None

    def part(self, sequences: Any) -> dict[str, Any]:
        return {"generation": self.gen.part(sequences)}

    def finish_record(self, record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> None:
        finish_record(record, parts)


def described(specs: list[tuple[tuple[int, ...], str]]) -> str:
    """Tensors as a line names them: ``2 tensors: Bx64x56x56 float32, Bx64x56x56 float32``."""
    shapes = ", ".join("x".join(["B", *map(str, shape)]) + f" {dtype}" for shape, dtype in specs[:4])
    more = f", ... ({len(specs)} in all)" if len(specs) > 4 else ""
    return f"{len(specs)} tensor{'s' if len(specs) != 1 else ''}: {shapes}{more}"
