"""Search spaces: a plan's cuts are one configuration in any order, the size is what the
configurations enumerate, and a lookup table replays a measured or modelled space."""

from __future__ import annotations

import pandas as pd
import pytest

from paretopipe.errors import UsageError
from paretopipe.search.space import Dimension, Space, from_table

PLAN = Space((Dimension("cut1", (0, 3, 9, 19), True), Dimension("cut2", (0, 3, 9, 19), True),
              Dimension("codec", ("float32/none", "float16/none"))), plan=("cut1", "cut2"))


def test_a_plan_is_the_same_whichever_order_its_cuts_were_suggested_in():
    assert PLAN.normalise({"cut1": 9, "cut2": 3, "codec": "float16/none"}) == (3, 9, "float16/none")
    assert PLAN.normalise({"cut1": 3, "cut2": 9, "codec": "float16/none"}) == (3, 9, "float16/none")
    configs = list(PLAN.configs())
    assert len(configs) == len(set(configs)) == PLAN.size() == 10 * 2  # 4 positions, 2 cuts: C(5, 2) plans
    assert all(c[0] <= c[1] for c in configs)


def test_a_chain_whose_every_stage_runs_a_block_has_distinct_cuts_and_a_search_measures_no_other():
    """A language model's chain (distinct): plans with coinciding cuts are outside the space; a
    sampler that suggests one is told so and a configuration of the space is measured instead."""
    from paretopipe.search import loop

    strict = Space(PLAN.dims, PLAN.plan, distinct=True)
    configs = list(strict.configs())
    assert len(configs) == strict.size() == 6 * 2 and all(c[0] < c[1] for c in configs)  # C(4, 2) plans
    assert not strict.valid((3, 3, "float32/none")) and strict.valid((3, 9, "float32/none"))
    measured = []

    def evaluate(config):
        measured.append(config)
        return (float(config[1] - config[0]), float(config[0]))

    result = loop.search(strict, evaluate, {"a": "min", "b": "max"}, budget=strict.size(), sampler="random", seed=1)
    assert sorted(measured) == sorted(configs) and len(result.trials) == len(configs)


def test_a_lookup_table_answers_each_configuration_with_its_median_and_none_where_it_has_no_row():
    table = pd.DataFrame({"cut1": [3, 3, 9], "cut2": [9, 9, 19], "codec": ["a", "a", "b"],
                          "latency_s": [1.0, 3.0, 2.0], "throughput_imgs_per_s": [5.0, 7.0, 4.0]})
    lookup = from_table(table, ["cut1", "cut2", "codec"], {"latency_s": "min", "throughput_imgs_per_s": "max"},
                        plan=["cut1", "cut2"])
    assert lookup.space.dim("cut1").choices == lookup.space.dim("cut2").choices == (3, 9, 19)
    assert lookup.values((3, 9, "a")) == (2.0, 6.0) and lookup.values((9, 19, "b")) == (2.0, 4.0)
    assert lookup.values((3, 19, "a")) is None and len(lookup) == 2


def test_bad_spaces_are_one_line_each():
    with pytest.raises(UsageError, match="codec has no choices"):
        Dimension("codec", ())
    with pytest.raises(UsageError, match="repeats a choice"):
        Dimension("batch_size", (1, 1))
    with pytest.raises(UsageError, match="same positions"):
        Space((Dimension("cut1", (0, 3)), Dimension("cut2", (0, 9))), plan=("cut1", "cut2"))
    with pytest.raises(UsageError, match="no column 'energy_j'"):
        from_table(pd.DataFrame({"k": [1], "latency_s": [1.0]}), ["k"], {"energy_j": "min"})
