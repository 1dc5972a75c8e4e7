"""The model a stage process holds, of either kind: an image model's
:class:`~paretopipe.partition.stages.StageBuilder` or a language model's
:class:`~paretopipe.llm.builder.LMBuilder`. Both hand out a stage for any plan of cuts and say
what crosses each cut; the model's name (or a ``--model-dir``) decides which. :class:`StageModel`
is what the runtime asks of both; what one kind alone has (an image model's engines, a language
model's tokenizer and prompts) is used only where the workload is that kind's."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..llm.families import family_of


@runtime_checkable
class StageModel(Protocol):
    """What the runtime asks of a stage process's model, whichever the workload: its identity for
    the handshake (``name``, ``fingerprint``, ``num_classes``: an image model's classes, a language
    model's vocabulary), where it runs, its cut points (``partitioner``), the cuts of a split, a
    stage for any plan of cuts and that stage's memory. ``input_size`` is an image model's side
    (None for a language model, whose inputs are prompts)."""

    name: str
    fingerprint: str
    num_classes: int
    device: str
    input_size: int | None
    partitioner: Any

    def cuts_for(self, split_index: int | None = None, cut: str | None = None) -> list[str]: ...

    def stage(self, cuts: list[str], index: int) -> Any: ...

    def stage_memory(self, cfg: Any, index: int) -> dict[str, int]: ...


def stage_builder(model: str | None, *, num_classes: int | None = None, weights: str | None = None,
                  models_dir: str | None = None, device: str = "cpu",
                  model_dir: str | None = None) -> StageModel:
    """Build the stages' model once per process, as the model's family builds it: a language
    model's from its shape or folder, else an image model's (:mod:`paretopipe.llm.families`)."""
    return family_of(model, model_dir).builder(model, num_classes=num_classes, weights=weights,
                                              models_dir=models_dir, device=device, model_dir=model_dir)
