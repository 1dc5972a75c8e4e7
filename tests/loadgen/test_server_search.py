"""The Server search's rule on scripted LoadGen runs: from any first guess it brackets and halves
to the highest passing rate, and the bound is LoadGen's own performance check."""

from __future__ import annotations

import pytest

from paretopipe.loadgen import server_search


def _scripted(limit: float):
    """A pipeline that holds the bound exactly up to ``limit`` queries per second."""
    asked = []

    def measure(rate: float) -> server_search.Step:
        asked.append(rate)
        return server_search.Step(rate, rate <= limit, {"loadgen_target_qps": rate})
    return measure, asked


@pytest.mark.parametrize("first", [1.0, 37.0, 400.0])
def test_the_search_finds_the_highest_passing_rate_from_any_first_guess(first):
    measure, asked = _scripted(37.0)
    done = server_search.search(measure, first, steps=14, precision=0.02)
    best = server_search.best(done)
    assert best is not None and 37.0 * 0.98 <= best.target_qps <= 37.0
    assert [s.target_qps for s in done] == asked and len(done) <= 14
    assert all(s.passed == (s.target_qps <= 37.0) for s in done)


def test_no_passing_rate_gives_none_and_the_steps_are_kept():
    measure, _ = _scripted(0.0)
    done = server_search.search(measure, 8.0, steps=4)
    assert server_search.best(done) is None and [s.target_qps for s in done] == [8.0, 4.0, 2.0, 1.0]


def test_a_stop_request_ends_the_search_between_runs():
    measure, asked = _scripted(100.0)
    calls = iter([False, False, True])
    done = server_search.search(measure, 10.0, steps=10, stop=lambda: next(calls))
    assert len(done) == len(asked) == 2


def test_passing_is_loadgens_performance_constraint_and_keeping_up_with_the_arrivals():
    assert server_search.passes({"loadgen_perf_constraints_met": False, "loadgen_latency_p99_s": 0.01}, 0.1) is False
    assert server_search.passes({"loadgen_latency_p99_s": 0.09}, 0.1) is True
    assert server_search.passes({"loadgen_latency_p99_s": 0.11}, 0.1) is False
    assert server_search.passes({}, 0.1) is False
    # 12 s of arrivals at 22.8 q/s: a stable pipeline completes them within 12 s plus the 0.5 s bound
    # (at least 21.9 q/s); one that completed 18 q/s fell behind, however short the run kept its tail.
    kept = {"loadgen_perf_constraints_met": True, "loadgen_scheduled_samples_per_s": 22.8, "loadgen_queries": 274}
    assert server_search.passes({**kept, "loadgen_samples_per_s": 18.0}, 0.5) is False
    assert server_search.passes({**kept, "loadgen_samples_per_s": 21.0}, 0.5) is True
    # A short run with a loose bound: the same completed rate is within what a stable pipeline does.
    assert server_search.kept_up({**kept, "loadgen_queries": 23, "loadgen_samples_per_s": 18.0}, 0.5) is True
