"""A model of either kind behind one protocol: an image model of the zoo, or a language model.

Which kind a model is gets decided once, by its name or its folder
(:func:`paretopipe.llm.shapes.workload_of`), and :func:`family_of` hands out that kind's family.
What differs by kind is then a method of its family, not a branch in each caller: the
controller's view of its splits, the name its records give it, the fingerprint and cut digest a
host check compares between hosts, and the stage builder a stage process holds
(:class:`paretopipe.transport.stagemodel.StageModel`). No torch at import: each method that needs
it imports it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from ..partition.names import DEFAULT_NUM_CLASSES, canonical_name
from ..partition.structure import structure
from ..workload import GENERATION, IMAGES, Workload
from .shapes import cut_table, shape_of, workload_of


class ModelFamily(Protocol):
    """What a caller asks of a model, whichever kind it is."""

    workload: Workload

    def check_name(self, model: str) -> None:
        """Refuse an unknown name in one line, before anything starts."""

    def record_name(self, model: str, model_dir: str | None) -> str:
        """The model as its records name it."""

    def structure(self, model: str, num_classes: int, model_dir: str | None) -> dict[str, Any]:
        """What a controller needs of its splits, without torch: ``model``, ``num_blocks``, ``fine_cuts``."""

    def fingerprint(self, model: str, num_classes: int, model_dir: str | None) -> str:
        """The weights a stage holds, as two hosts compare them."""

    def cut_digest(self, model: str, num_classes: int, model_dir: str | None) -> str:
        """A digest of the cuts two hosts must agree on to split the model the same way."""

    def builder(self, model: str | None, *, num_classes: int | None, weights: str | None, models_dir: str | None,
                device: str, model_dir: str | None) -> Any:
        """The stages' model, built once per process (a ``StageModel``)."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ImageModels:
    """The model zoo's (and model files', and entry points') image models."""

    workload = IMAGES

    def check_name(self, model: str) -> None:
        canonical_name(model)

    def record_name(self, model: str, model_dir: str | None) -> str:
        return canonical_name(model)

    def structure(self, model: str, num_classes: int, model_dir: str | None) -> dict[str, Any]:
        return structure(model, num_classes)

    def fingerprint(self, model: str, num_classes: int, model_dir: str | None) -> str:
        # lazy for start-up: torch
        from ..partition import models as zoo

        return zoo.fingerprint(zoo.build(model, num_classes=num_classes))

    def cut_digest(self, model: str, num_classes: int, model_dir: str | None) -> str:
        # lazy for start-up: torch
        from ..partition.tables import partitioner_for

        _, part = partitioner_for(model, num_classes=num_classes, structure_only=True)
        cuts = [[c.name, list(c.shape), c.dtype] for c in part.cuts]
        return _digest(json.dumps({"cuts": cuts, "blocks": part.block_cuts()}, sort_keys=True))

    def builder(self, model: str | None, *, num_classes: int | None, weights: str | None, models_dir: str | None,
                device: str, model_dir: str | None) -> Any:
        # lazy for start-up: torch
        from ..partition.stages import StageBuilder

        return StageBuilder(model, num_classes or DEFAULT_NUM_CLASSES, weights, models_dir, device)


class LanguageModels:
    """Language models: a named shape, a named real model, or weights in ``--model-dir``. Their
    head is their vocabulary, so ``num_classes`` and ``weights`` (an image model's) are not theirs."""

    workload = GENERATION

    def check_name(self, model: str) -> None:
        pass  # a name that is not a language model's is an image model's, checked there

    def record_name(self, model: str, model_dir: str | None) -> str:
        return shape_of(model, model_dir).name

    def structure(self, model: str, num_classes: int, model_dir: str | None) -> dict[str, Any]:
        shape = shape_of(model, model_dir)  # cut between blocks only: no fine cuts
        return {"model": shape.name, "num_blocks": shape.last_split, "fine_cuts": {}}

    def fingerprint(self, model: str, num_classes: int, model_dir: str | None) -> str:
        """Its identity (configuration and weights' source) with its first layer's weights as drawn
        or read here: a whole model of a billion parameters is not built for a check."""
        # lazy for start-up: torch, transformers
        from .build import block_weights, source
        # lazy for start-up: torch
        from ..partition.models import fingerprint_tensors

        src = source(None if model_dir else model, model_dir)
        return f"{src.identity()}/{fingerprint_tensors(block_weights(src, 'model.layers.0'))}"

    def cut_digest(self, model: str, num_classes: int, model_dir: str | None) -> str:
        return _digest(cut_table(shape_of(model, model_dir)))

    def builder(self, model: str | None, *, num_classes: int | None, weights: str | None, models_dir: str | None,
                device: str, model_dir: str | None) -> Any:
        # lazy for start-up: torch, transformers
        from .builder import LMBuilder

        return LMBuilder(model, model_dir, device)


FAMILIES: dict[str, ModelFamily] = {f.workload.name: f for f in (ImageModels(), LanguageModels())}


def family_of(model: str | None, model_dir: str | None = None) -> ModelFamily:
    """The family of the kind :func:`~paretopipe.llm.shapes.workload_of` finds (a language model's
    weights in ``--model-dir``, a named real one or a named shape; else an image model)."""
    return FAMILIES[workload_of(model, model_dir).name]


def model_structure(model: str, num_classes: int, model_dir: str | None = None) -> dict[str, Any]:
    """What a controller needs of a model's splits, without torch: its name, its largest split
    (``num_blocks``) and its fine cuts (a language model has none: it is cut between blocks)."""
    return family_of(model, model_dir).structure(model, num_classes, model_dir)
