"""The privacy-cost table: each sealed configuration beside its plain twin, hand-checked ratios."""

from __future__ import annotations

import pandas as pd
import pytest

from paretopipe.analysis.privacy import COLUMNS, format_privacy_cost, privacy_cost


def _row(cipher: str, k: int, latency: float, throughput: float, network: str = "lan", **parts: float) -> dict:
    return {"model": "m", "backend": "tcp", "cipher": cipher, "network": network, "batch_size": 1, "split_index": k,
            "status": "complete", "latency_s": latency, "throughput_imgs_per_s": throughput, **parts}


def test_each_sealed_configuration_is_set_beside_its_plain_twin():
    configs = pd.DataFrame([
        _row("none", 2, 0.010, 100.0), _row("none", 5, 0.020, 50.0),
        _row("aesgcm", 2, 0.012, 80.0, stage1_seal_mean_s=0.001, stage2_open_mean_s=0.0005, result_open_mean_s=0.0001),
        _row("aesgcm", 5, 0.021, 49.0, stage1_seal_mean_s=0.0002),
        _row("aesgcm", 9, 0.030, 30.0),                   # no plain twin: left out
        _row("aesgcm", 2, 0.050, 10.0, network="lte"),    # a twin on another network does not count
    ])
    cost = privacy_cost(configs)
    assert list(cost.columns) == COLUMNS
    assert [(r.network, r.split_index) for r in cost.itertuples()] == [("lan", "2"), ("lan", "5")]
    first = cost.iloc[0]
    assert first["latency_ratio"] == pytest.approx(1.2) and first["throughput_ratio"] == pytest.approx(0.8)
    assert first["seal_open_mean_s"] == pytest.approx(0.0016)
    assert cost.iloc[1]["seal_open_mean_s"] == pytest.approx(0.0002)
    text = format_privacy_cost(cost)
    assert "x1.200" in text and "x0.800" in text


def test_a_plain_session_has_no_privacy_cost():
    plain = pd.DataFrame([_row("none", 2, 0.01, 100.0)])
    assert privacy_cost(plain).empty and format_privacy_cost(privacy_cost(plain)) == ""
    assert privacy_cost(plain.drop(columns=["cipher"])).empty  # a table from before ciphers
