"""llama.cpp beside our engine in a report: the cost model's time per token from a link's
conditions and the relay's counts, its error against what was measured, and the engines' token
agreement. Tables and records as a sweep writes them; tests/peers runs the real thing."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from paretopipe.analysis import peer_gap
from paretopipe.analysis.session import Session

LTE = {"name": "lte", "up": {"delay_ms": 35.0, "rate_mbit_per_s": 12.0}, "down": {"delay_ms": 35.0,
                                                                                  "rate_mbit_per_s": 12.0}}


def test_link_terms_read_both_directions_delay_and_rate():
    assert peer_gap.link_terms(LTE) == pytest.approx((0.070, 1.5e6, 1.5e6))
    assert peer_gap.link_terms({"up": {}, "down": {}}) == (0.0, None, None)
    assert peer_gap.link_terms(None) == (0.0, None, None)


def test_the_cost_model_adds_round_trips_and_bytes_at_each_directions_rate():
    # llama.cpp at lte: 22 ms of compute, one 70 ms round trip, 7,676 bytes up and 196,616 down at 1.5 MB/s
    value = peer_gap.predicted_tpot(0.022, 0.070, 1.0, 7676, 196_616, 1.5e6, 1.5e6)
    assert value == pytest.approx(0.022 + 0.070 + 7676 / 1.5e6 + 196_616 / 1.5e6)
    assert peer_gap.predicted_tpot(0.02, 0.0, 1.0, 7676, 196_616, None, None) == 0.02


def _row(engine: str, network: str, tpot: float, up: float, down: float) -> dict:
    return {"model": "m", "prompt_len": 16, "network": network, "split_index": 16, "engine": engine,
            "ttft_median_s": 0.1, "tpot_median_s": tpot, "bytes_per_token": up, "down_bytes_per_token": down,
            "round_trips_per_token": 1.0}


def test_llamacpps_rows_get_a_prediction_from_the_unshaped_networks_compute_and_ours_none():
    configs = pd.DataFrame([_row("llamacpp", "lan", 0.022, 7676, 196_616),
                            _row("llamacpp", "lte", 0.250, 7676, 196_616),
                            _row("torch", "lan", 0.072, 2304, 0), _row("torch", "lte", 0.150, 2304, 0)])
    table = peer_gap.gap_table(configs, {"lan": {"up": {}, "down": {}}, "lte": LTE}).set_index(["engine", "network"])
    expected = 0.022 + 0.070 + (7676 + 196_616) / 1.5e6
    assert table.loc[("llamacpp", "lte"), "tpot_predicted_s"] == pytest.approx(expected)
    assert table.loc[("llamacpp", "lte"), "tpot_prediction_error"] == pytest.approx((expected - 0.25) / 0.25)
    assert table.loc[("llamacpp", "lan"), "tpot_prediction_error"] == 0.0
    assert pd.isna(table.loc[("torch", "lte"), "tpot_predicted_s"])


def test_without_an_unshaped_network_there_is_no_compute_to_predict_from():
    configs = pd.DataFrame([_row("llamacpp", "lte", 0.25, 7676, 196_616)])
    assert pd.isna(peer_gap.gap_table(configs, {"lte": LTE})["tpot_predicted_s"].iloc[0])


def test_agreement_is_the_share_of_tokens_before_the_first_that_differs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    rows = []
    # run 1 has other seeded prompts (the seed is the run's index): compared with ours of run 1 only
    for engine, run, tokens in (("torch", 0, [[1, 2, 3, 4], [5, 6, 7, 8]]), ("torch", 1, [[7, 7, 7, 7], [8, 8, 8, 8]]),
                                ("llamacpp", 0, [[1, 2, 9, 4], [5, 6, 7, 8]]),
                                ("llamacpp", 1, [[7, 7, 7, 7], [8, 0, 8, 8]])):
        name = f"runs/{engine}{run}.json"
        record = {"summary": {}, "config": {"seed": run, "generation": {"temperature": 0.0}},
                  "generation": {"tokens": tokens}}
        (tmp_path / name).write_text(json.dumps(record))
        rows.append({"engine": engine, "prompt_len": 16, "network": "lan", "split_index": 16, "run": run, "json": name})
    agree = peer_gap.agreement(Session(tmp_path), pd.DataFrame(rows))
    assert agree["tokens_agree_with_torch"].tolist() == [pytest.approx((2 / 4 + 4 / 4) / 2),
                                                         pytest.approx((4 / 4 + 1 / 4) / 2)]
