"""Stage 1 of a TCP run of a language model: :class:`~.source.Stage1Run` with a generation's
source (:class:`~paretopipe.transport.endpoint.PromptSource`). Its batches are a stream's steps;
each carries the hidden state (or the ids) and the step's place, always in float32 before the
codec, and its result is the step's token, which feeds the stream's next step. A guarded
generation keeps each stream's positions (:class:`~paretopipe.transport.generation.LocalTail`) so
that a step whose token does not come in time is finished here, and a stage 2 that comes back gets
the positions it lacks."""

from __future__ import annotations

from typing import Any, Iterable

from .. import pipeline, wire
from ..endpoint import PromptSource
from ..generation import LocalTail
from .source import Stage1Run


class PromptStage1Run(Stage1Run, PromptSource):
    """Stage 1's endpoint for a generation: the image run's connection, faults and bookkeeping,
    with the generation's compute, frames and schedule."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        # A hidden state is cast (or quantised) to its wire dtype by the stage, before the codec.
        self.codec = wire.Codec(cfg.compression, cfg.compression_level, "float32")
        self.tail = LocalTail(self.builder, cfg) if self.guarded else None

    def actions(self) -> Iterable[pipeline.Action]:
        if self.guarded:  # a generation's steps are its schedule: none beyond them
            return pipeline.generation_actions(self.feed.steps, settle=True)
        return PromptSource.actions(self)

    def compute(self, seq: int) -> None:
        stream, start = self.step
        self.out, self.rec["stage1_compute_s"] = self.feed.stage.forward(seq, stream, self.x, start)
        if self.tail is not None:
            self.tail.computed(stream, start, self.out)

    def _tensor_frame(self, seq: int) -> wire.Encoded:
        """The step's hidden state (or ids) with its place; a stage 2 without the stream's earlier
        positions (a new one, after a kill) gets them too."""
        stream, start = self.step
        out, at = self.out, start
        if self.tail is not None:
            at = self.next.positions.get(stream, 0)
            out = out if at == start else self.tail.since(stream, at)
            self.next.positions[stream] = start + self.out.shape[1]
        return wire.frame(wire.TENSOR, seq, wire.encode_payload(self.feed.stage.encode(out), self.codec),
                          self.feed.meta(seq, at))

    def _serve_here(self, seq: int, gave_up: float) -> None:
        """The step's token from the rest of the model here, fed on."""
        token, local_s = self.tail.finish(self.step[0], self.feed.steps[seq].step, self.step[1])
        self._served_here(seq, gave_up, local_s, {"token": token})

    def _stage2_served(self) -> None:
        self.tail.stage2_served(self.step[0])

    def workload_part(self) -> dict[str, Any]:
        """The streams' prompts and tokens, and the stage's own figures."""
        return {"generation": {**self.feed.part(), **self.feed.stage.part()}}

    def stage_engine(self) -> None:
        """None: a language model's stage runs on torch (llama.cpp is a peer system of its own)."""
        return None
