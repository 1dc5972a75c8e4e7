"""The samplers by name: each builds seeded (the same seed proposes the same configurations) and
an unknown name is one line naming the valid ones."""

from __future__ import annotations

import warnings

import optuna
import pytest

from paretopipe.errors import UsageError
from paretopipe.search.samplers import DEFAULT_SAMPLER, SAMPLERS, make_sampler


@pytest.mark.parametrize("name", SAMPLERS)
def test_each_sampler_is_seeded(name):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {"x": optuna.distributions.IntDistribution(0, 50), "y": optuna.distributions.CategoricalDistribution([0, 1, 2])}
    proposed = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no experimental-interface warning reaches the user
        for _ in range(2):
            study = optuna.create_study(directions=["minimize", "maximize"], sampler=make_sampler(name, seed=5, startup=2))
            params = []
            for _ in range(4):
                trial = study.ask(dists)
                params.append((trial.params["x"], trial.params["y"]))
                study.tell(trial, [trial.params["x"], trial.params["y"]])
            proposed.append(params)
    assert proposed[0] == proposed[1] and len(set(proposed[0])) > 1


def test_an_unknown_sampler_is_one_line_and_the_default_is_a_known_one():
    assert DEFAULT_SAMPLER in SAMPLERS
    with pytest.raises(UsageError, match="unknown sampler 'sobol'; valid: tpe, gp, nsga2, qmc, random"):
        make_sampler("sobol", 0)
