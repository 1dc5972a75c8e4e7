"""The search: Optuna's ask-and-tell loop over a :class:`~.space.Space`, within a budget of
distinct configurations, each measured once.

A predicted front (the cost model's, from device profiles) is measured first, enqueued in its
order; then the sampler explores. A sampler that proposes a configuration already measured is
not measured again: that proposal fails (told again, it would weigh twice in the sampler's model)
and a configuration not measured yet, drawn at random, is measured instead, so the budget counts
measurements. Each trial keeps where it came from (``prediction``, ``sampler`` or ``fill``)."""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any, Callable, Sequence

import numpy as np

from ..analysis import pareto
from ..errors import UsageError
from .samplers import DEFAULT_SAMPLER, make_sampler
from .space import Config, Space

log = logging.getLogger("paretopipe.search")
#: Proposals per unit of budget before a search that keeps proposing measured configurations ends.
MAX_PROPOSALS_PER_BUDGET = 20


@dataclasses.dataclass(frozen=True)
class Trial:
    """One configuration measured: its objectives (None: infeasible) and where it came from."""

    config: Config
    values: tuple[float, ...] | None
    origin: str  # "prediction", "sampler", or "fill" (drawn at random after the sampler repeated itself)


@dataclasses.dataclass
class SearchResult:
    space: Space
    objectives: dict[str, str]
    sampler: str
    trials: list[Trial]
    proposals: int  # suggestions made, repeats of measured configurations included

    def points(self, first: int | None = None) -> np.ndarray:
        """The objectives of the feasible configurations among the first ``first`` measured."""
        vals = [t.values for t in self.trials[:first] if t.values is not None]
        return np.array(vals, dtype=float).reshape(-1, len(self.objectives))

    def hypervolume(self, lower: np.ndarray, upper: np.ndarray, first: int | None = None) -> float:
        """The hypervolume of the front of the first ``first`` configurations, normalised to
        ``lower``..``upper`` (those of the whole space, to compare with its exhaustive front)."""
        return normalised_hypervolume(self.points(first), list(self.objectives.values()), lower, upper)


def bounds(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each objective's least and greatest value over ``points`` (for :func:`normalised_hypervolume`)."""
    pts = np.asarray(points, dtype=float)
    return pts.min(axis=0), pts.max(axis=0)


def normalised_hypervolume(points: np.ndarray, senses: Sequence[str], lower: np.ndarray, upper: np.ndarray) -> float:
    """The hypervolume of ``points``' front in [0, 1] minimisation space (reference 1.1), as the
    report computes a front's."""
    pts = np.asarray(points, dtype=float)
    if len(pts) == 0:
        return 0.0
    norm = pareto.normalise(pts, senses, lower, upper)
    return pareto.hypervolume(norm[pareto.front_mask(norm, ["min"] * norm.shape[1])])


def search(space: Space, evaluate: Callable[[Config], tuple[float, ...] | None], objectives: dict[str, str],
           budget: int, sampler: str = DEFAULT_SAMPLER, seed: int = 0, seeds: Sequence[Config] = (),
           startup: int = 10, on_trial: Callable[[Trial], None] | None = None) -> SearchResult:
    """Measure at most ``budget`` distinct configurations of ``space``: ``seeds`` (the predicted
    front) first, then the ``sampler``'s. ``evaluate`` measures one (None: infeasible)."""
    # lazy for start-up: optuna (only a search needs it)
    import optuna

    total = space.size()
    if total == 0:
        raise UsageError("the search space is empty")
    if budget < 1:
        raise UsageError(f"--budget {budget}: give at least 1 configuration")
    seeds = list(dict.fromkeys(space.normalise(space.as_dict(c)) for c in seeds))
    if len(seeds) > budget:
        raise UsageError(f"--budget {budget} is below the predicted front's {len(seeds)} configurations, which are "
                         f"measured first: give at least {len(seeds)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize" if s == "min" else "maximize" for s in objectives.values()],
                                sampler=make_sampler(sampler, seed, startup + len(seeds)))
    dists = {d.name: optuna.distributions.IntDistribution(0, len(d.choices) - 1) if d.ordered
             else optuna.distributions.CategoricalDistribution(list(range(len(d.choices)))) for d in space.dims}
    for config in seeds:
        study.enqueue_trial({d.name: d.choices.index(v) for d, v in zip(space.dims, config)})
    measured: dict[Config, tuple[float, ...] | None] = {}
    trials: list[Trial] = []
    proposals = 0
    goal = min(budget, total)
    fills: list[Config] = []  # configurations enqueued in place of a repeat
    rng = random.Random(seed)
    while len(measured) < goal and proposals < MAX_PROPOSALS_PER_BUDGET * budget:
        trial = study.ask(dists)
        config = space.normalise({d.name: d.choices[trial.params[d.name]] for d in space.dims})
        origin = "prediction" if proposals < len(seeds) else "fill" if fills and config == fills[0] else "sampler"
        if origin == "fill":
            fills.pop(0)
        proposals += 1
        if config in measured:
            # A repeat would be measured for nothing, and told again it would weigh twice in the
            # sampler's model (TPE then circles its best region): it fails, and a configuration not
            # measured yet, drawn at random, is asked next.
            _tell(study, trial, None)
            fill = _unmeasured(space, measured, rng)
            if fill is not None and not fills:
                fills.append(fill)
                study.enqueue_trial({d.name: d.choices.index(v) for d, v in zip(space.dims, fill)})
            continue
        measured[config] = evaluate(config)
        trials.append(Trial(config, measured[config], origin))
        if on_trial is not None:
            on_trial(trials[-1])
        _tell(study, trial, measured[config])
    if len(measured) < goal:
        log.warning("the %s sampler kept proposing measured configurations: %d of %d measured after %d proposals",
                    sampler, len(measured), goal, proposals)
    return SearchResult(space, dict(objectives), sampler, trials, proposals)


def _unmeasured(space: Space, measured: dict, rng: random.Random, tries: int = 200) -> Config | None:
    """A configuration not measured yet, uniformly at random (None when none is found)."""
    for _ in range(tries):
        config = space.normalise({d.name: rng.choice(d.choices) for d in space.dims})
        if config not in measured:
            return config
    return None


def _tell(study: Any, trial: Any, values: tuple[float, ...] | None) -> None:
    # lazy for start-up: optuna
    from optuna.trial import TrialState

    if values is None:
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, list(values))
