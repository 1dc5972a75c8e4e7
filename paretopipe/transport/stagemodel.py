"""The model a stage process holds, of either kind: an image model's
:class:`~paretopipe.partition.stages.StageBuilder` or a language model's
:class:`~paretopipe.llm.builder.LMBuilder`. Both hand out a stage for any plan of cuts and say
what crosses each cut; the model's name (or a ``--model-dir``) decides which."""

from __future__ import annotations

from ..llm.builder import LMBuilder
from ..llm.shapes import workload_of
from ..partition.names import DEFAULT_NUM_CLASSES
from ..partition.stages import StageBuilder


def stage_builder(model: str | None, *, num_classes: int | None = None, weights: str | None = None,
                  models_dir: str | None = None, device: str = "cpu",
                  model_dir: str | None = None) -> StageBuilder | LMBuilder:
    """Build the stages' model once per process: a language model's from its shape or folder (its
    head is its vocabulary: ``num_classes`` and ``weights`` are an image model's), else an image model's."""
    if workload_of(model, model_dir).generates:
        return LMBuilder(model, model_dir, device)
    return StageBuilder(model, num_classes or DEFAULT_NUM_CLASSES, weights, models_dir, device)
