"""The search loop over a space modelled in full: it measures each configuration once, the
predicted front first, and with the whole space as its budget it finds the exhaustive front."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from paretopipe.errors import UsageError
from paretopipe.predict.costmodel import LinkModel, chain_terms
from paretopipe.predict.device_profile import synthetic_profile
from paretopipe.search import loop
from paretopipe.search.space import from_table

OBJECTIVES = {"latency_s": "min", "throughput_imgs_per_s": "max"}


def _three_stage_table() -> pd.DataFrame:
    """Every plan of two cuts over 9 boundaries of a 3-device chain, from the cost model."""
    sizes = [int(6e5 * 0.7 ** i) for i in range(8)] + [4000]
    devices = [synthetic_profile([s * t for t in (2e-3, 1e-3, 3e-3, 1e-3, 2e-3, 1e-3, 2e-3, 5e-4)], sizes)
               for s in (3.0, 3.0, 0.2)]
    links = [LinkModel.of(delay_s=0.003, rate_bps=50e6), LinkModel.of(delay_s=0.02, rate_bps=10e6)]
    rows = []
    for a in range(9):
        for b in range(a, 9):
            terms = chain_terms(devices, links, [a, b], 1)
            rows.append({"cut1": a, "cut2": b, "latency_s": terms.latency_s(),
                         "throughput_imgs_per_s": terms.throughput_imgs_per_s()})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def table():
    return from_table(_three_stage_table(), ["cut1", "cut2"], OBJECTIVES, plan=["cut1", "cut2"])


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "random"])
def test_with_the_whole_space_as_budget_each_configuration_is_measured_once_and_the_front_is_exact(table, sampler):
    calls = []

    def evaluate(config):
        calls.append(config)
        return table.values(config)

    result = loop.search(table.space, evaluate, OBJECTIVES, budget=len(table), sampler=sampler, seed=3)
    assert len(calls) == len(set(calls)) == len(table) == 45
    truth = np.array(table.all_values())
    lower, upper = loop.bounds(truth)
    assert result.hypervolume(lower, upper) == pytest.approx(loop.normalised_hypervolume(truth, ["min", "max"],
                                                                                          lower, upper))
    assert {t.origin for t in result.trials} <= {"sampler", "fill"}


def test_the_predicted_front_is_measured_first_and_said_to_come_from_the_prediction(table):
    truth = np.array(table.all_values())
    front = [c for c, on in zip(table.table[["cut1", "cut2"]].itertuples(index=False, name=None),
                                loop.pareto.front_mask(truth, ["min", "max"])) if on]
    result = loop.search(table.space, table.values, OBJECTIVES, budget=len(front) + 5, sampler="tpe", seed=0,
                         seeds=front)
    assert [t.config for t in result.trials[:len(front)]] == front
    origins = [t.origin for t in result.trials]
    assert origins[:len(front)] == ["prediction"] * len(front) and set(origins[len(front):]) <= {"sampler", "fill"}
    assert len(origins) == len(front) + 5
    lower, upper = loop.bounds(truth)
    assert result.hypervolume(lower, upper, len(front)) == pytest.approx(
        loop.normalised_hypervolume(truth, ["min", "max"], lower, upper))


def test_the_predicted_layers_come_first_each_groups_front_then_the_next_up_to_half_the_budget():
    configs = ["a", "b", "c", "d", "e", "f"]
    # (latency, throughput): a and b on lan's front, c behind b; d alone on lte's front, then e, then f.
    values = [(1.0, 5.0), (2.0, 9.0), (3.0, 8.0), (9.0, 1.0), (9.5, 0.9), (9.9, 0.5)]
    groups = ["lan", "lan", "lan", "lte", "lte", "lte"]
    ordered = loop.predicted_first(configs, values, ["min", "max"], budget=12, groups=groups)
    assert ordered == ["a", "b", "d", "c", "e", "f"]  # the fronts (lte's not dominated by lan's), then layers
    assert loop.predicted_first(configs, values, ["min", "max"], budget=8, groups=groups) == ["a", "b", "d", "c"]
    # The whole predicted front is measured even past half the budget, but never past the budget.
    assert loop.predicted_first(configs, values, ["min", "max"], budget=4, groups=groups, share=0.25) == ["a", "b", "d"]
    assert loop.predicted_first(configs, values, ["min", "max"], budget=2, groups=groups) == ["a", "b"]
    # Without groups, lte's configurations are dominated by lan's.
    assert loop.predicted_first(configs, values, ["min", "max"], budget=4) == ["a", "b"]


def test_the_same_seed_gives_the_same_search(table):
    runs = [loop.search(table.space, table.values, OBJECTIVES, budget=15, sampler="tpe", seed=7) for _ in range(2)]
    assert [t.config for t in runs[0].trials] == [t.config for t in runs[1].trials]


def test_infeasible_configurations_are_kept_but_never_on_the_front(table):
    def evaluate(config):  # a stage's memory limit: the first stage may hold at most 4 boundaries
        return None if config[0] > 4 else table.values(config)

    result = loop.search(table.space, evaluate, OBJECTIVES, budget=len(table), sampler="nsga2", seed=1)
    infeasible = [t for t in result.trials if t.values is None]
    assert len(result.trials) == 45 and len(infeasible) == sum(1 for a in range(5, 9) for _ in range(a, 9))
    assert len(result.points()) == 45 - len(infeasible)


def test_a_budget_below_the_predicted_front_and_an_unknown_sampler_are_one_line(table):
    with pytest.raises(UsageError, match="--budget 2 is below the predicted front's 3 configurations"):
        loop.search(table.space, table.values, OBJECTIVES, budget=2, seeds=[(0, 0), (0, 8), (8, 8)])
    with pytest.raises(UsageError, match="unknown sampler 'annealing'; valid: tpe, gp, nsga2, qmc, random"):
        loop.search(table.space, table.values, OBJECTIVES, budget=5, sampler="annealing")
    with pytest.raises(UsageError, match="--budget 0"):
        loop.search(table.space, table.values, OBJECTIVES, budget=0)
