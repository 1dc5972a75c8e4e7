"""The samplers a search may use, by name (all Optuna's, MIT):

- ``tpe``: multi-objective TPE (MOTPE), multivariate over the dimensions;
- ``gp``: Gaussian-process Bayesian optimisation, expected hypervolume improvement for several
  objectives;
- ``nsga2``: the genetic algorithm NSGA-II;
- ``qmc``: a quasi-random (Sobol) sequence, which covers the space evenly without learning;
- ``random``: uniform sampling, the baseline.

Which one is the default is decided by ``benchmarks/search.py``, which replays complete spaces."""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import UsageError

SAMPLERS = ("tpe", "gp", "nsga2", "qmc", "random")
#: The sampler that reached the most hypervolume with 10% of the large replayed space
#: (python benchmarks/search.py; docs/search.md).
DEFAULT_SAMPLER = "tpe"


def check_sampler(name: str) -> str:
    if name not in SAMPLERS:
        raise UsageError(f"unknown sampler {name!r}; valid: {', '.join(SAMPLERS)}")
    return name


def make_sampler(name: str, seed: int, startup: int = 10) -> Any:
    """An Optuna sampler, seeded; ``startup``: the random configurations a learning sampler
    measures before it models (after the predicted front's, which count among them)."""
    # lazy for start-up: optuna (only a search needs it)
    import optuna

    check_sampler(name)
    with warnings.catch_warnings():
        # Optuna marks GPSampler's and QMCSampler's interfaces experimental; they are used as documented.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _build(optuna, name, seed, startup)


def _build(optuna: Any, name: str, seed: int, startup: int) -> Any:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(10, startup * 2))
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    return optuna.samplers.RandomSampler(seed=seed)
