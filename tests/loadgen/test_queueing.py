"""The predicted Server rate: the bottleneck's capacity, and the rate whose predicted 99th
percentile (unloaded latency plus Kingman's wait) meets the bound."""

from __future__ import annotations

import math

import pytest

from paretopipe.loadgen import queueing


def test_the_wait_grows_with_the_load_and_is_unbounded_at_capacity():
    s = 0.02
    waits = [queueing.wait_quantile_s(r, s) for r in (0.4, 10, 25, 40, 49)]
    assert waits[0] == 0.0 and all(a < b for a, b in zip(waits[1:], waits[2:]))
    assert queueing.wait_quantile_s(50, s) == math.inf
    # M/D/1 at rho = 0.9: Kingman's mean wait is rho s / (2 (1 - rho)) = 90 ms; its 99th percentile
    # is s / (2 (1 - rho)) ln(rho / 0.01).
    assert queueing.wait_quantile_s(45, s) == pytest.approx(0.1 * math.log(90), rel=1e-9)


def test_the_predicted_rate_meets_the_bound_and_approaches_capacity_as_the_bound_loosens():
    s, latency = 0.02, 0.05
    rates = [queueing.server_bound(s, latency, b)["predicted_qps"] for b in (0.1, 0.5, 5.0)]
    assert rates[0] < rates[1] < rates[2] < 50.0 and rates[2] > 0.97 * 50
    for bound, rate in zip((0.1, 0.5, 5.0), rates):
        assert latency + queueing.wait_quantile_s(rate, s) <= bound + 1e-9
        assert latency + queueing.wait_quantile_s(rate * 1.01, s) > bound
    assert queueing.server_bound(s, 0.2, 0.1) == {"capacity_qps": 50.0, "predicted_qps": 0.0}


def test_predicted_columns_take_the_cost_models_bottleneck():
    class Terms:  # the two ChainTerms methods used, for a split whose link is its bottleneck
        batch_size = 1

        def bottleneck(self):
            return "link1", 0.025

        def latency_s(self):
            return 0.04

    cols = queueing.predicted_columns(Terms(), 0.5)
    assert cols["predicted_server_capacity_qps"] == pytest.approx(40.0)
    assert cols["predicted_server_bottleneck"] == "link1" and 30 < cols["predicted_server_qps"] < 40
