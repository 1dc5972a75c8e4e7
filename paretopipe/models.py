"""``paretopipe.models``: the documented Python API of the model zoo (the code lives in
:mod:`paretopipe.partition.models`; this name is what the README and users' scripts import)."""

from .partition.models import (ANCHOR_ALIASES, NAMED_MODELS, build, canonical_name, fingerprint, input_size,
                               known_models, load_weights, register)

__all__ = ["ANCHOR_ALIASES", "NAMED_MODELS", "build", "canonical_name", "fingerprint", "input_size", "known_models",
           "load_weights", "register"]
