"""A LoadGen scenario's options: the short defaults, the edge rules under --mlperf-compliant (each
broken one refused by name), and the TestSettings LoadGen is given."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.loadgen.settings import (COMPLIANT_MIN_QUERIES, NOT_COMPLIANT, LoadgenOptions, make_test_settings)


def test_short_defaults_are_marked_not_compliant_and_compliant_defaults_are_the_edge_rules():
    short = LoadgenOptions.of_flags("singlestream")
    assert (short.min_duration_s, short.min_query_count, short.label) == (5.0, 64, NOT_COMPLIANT)
    for scenario, queries in COMPLIANT_MIN_QUERIES.items():
        rules = LoadgenOptions.of_flags(scenario, compliant=True)
        assert (rules.min_duration_s, rules.min_query_count, rules.label) == (600.0, queries, "MLPerf edge rules")


@pytest.mark.parametrize("kw, says", [
    ({"min_duration_s": 5}, "--min-duration-s 5 is below the edge rules' 600 s"),
    ({"min_query_count": 100}, "--min-query-count 100 is below the edge rules' 1024 queries"),
])
def test_compliant_refuses_settings_below_the_rules_by_name(kw, says):
    with pytest.raises(UsageError) as err:
        LoadgenOptions.of_flags("singlestream", compliant=True, **kw)
    assert says in str(err.value) and "drop --mlperf-compliant" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kw, says", [
    ({"scenario": "burst"}, "valid singlestream, multistream, offline, server"),
    ({"scenario": "server", "latency_bound_s": 0.0}, "--latency-bound-ms 0"),
    ({"scenario": "server", "server_qps": -1.0}, "--server-qps -1"),
    ({"scenario": "offline", "mode": "audit"}, "valid performance, accuracy"),
    ({"scenario": "server", "server_steps": 0}, "valid 1..30"),
])
def test_bad_options_are_one_line_each(kw, says):
    with pytest.raises(UsageError, match=says):
        LoadgenOptions(**kw)


def test_options_travel_as_json_and_refuse_an_unknown_key():
    opts = LoadgenOptions.of_flags("server", latency_bound_s=0.05, server_qps=12.5)
    assert LoadgenOptions.from_dict(opts.to_dict()) == opts
    with pytest.raises(UsageError, match="bogus"):
        LoadgenOptions.from_dict({**opts.to_dict(), "bogus": 1})


def test_test_settings_carry_the_scenario_the_expectations_and_a_cap_on_short_runs():
    import mlperf_loadgen as lg

    opts = LoadgenOptions.of_flags("multistream", min_duration_s=3, samples_per_query=4)
    s = make_test_settings(opts, expected_latency_s=0.01, expected_qps=50.0)
    assert s.scenario == lg.TestScenario.MultiStream and s.mode == lg.TestMode.PerformanceOnly
    assert (s.min_duration_ms, s.multi_stream_samples_per_query) == (3000, 4)
    assert s.multi_stream_expected_latency_ns == 40_000_000  # 4 samples of 10 ms
    assert s.max_duration_ms == 63_000  # a short run stops within a minute of its minimum
    server = make_test_settings(LoadgenOptions.of_flags("server", latency_bound_s=0.2), expected_latency_s=0.01,
                                expected_qps=50.0, server_qps=20.0)
    assert (server.server_target_qps, server.server_target_latency_ns) == (20.0, 200_000_000)
    assert server.server_target_latency_percentile == pytest.approx(0.99)
    compliant = make_test_settings(LoadgenOptions.of_flags("offline", compliant=True), expected_latency_s=0.01,
                                   expected_qps=50.0)
    assert compliant.max_duration_ms == 0 and compliant.min_query_count == 24576  # LoadGen's own: no cap
