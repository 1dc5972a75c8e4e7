"""The LoadGen front of a session's summary: one row per split from its scenarios' rows, the front
over p90, Offline samples/s and the Server rate, and the splits that join or leave the front
against the closed loop's."""

from __future__ import annotations

import pandas as pd

from paretopipe.analysis import loadgen_front

KEY = {"model": "m", "backend": "tcp", "cipher": "none", "transport": "tcp", "codec": "float32/none", "in_flight": 2,
       "network": "lan", "batch_size": 1}


def _summary() -> pd.DataFrame:
    rows = []
    # closed loop: k=0 fastest, k=4 best throughput, k=8 dominated.
    for k, lat, thr in ((0, 0.030, 30.0), (4, 0.040, 40.0), (8, 0.050, 20.0)):
        rows.append({**KEY, "split_index": k, "scenario": "closed", "latency_median_s": lat, "throughput_imgs_per_s": thr})
    # under LoadGen: k=8's tail is the best and k=4's Offline rate the highest; k=0 is dominated.
    for k, p90, sps, qps in ((0, 0.075, 25.0, 10.0), (4, 0.070, 45.0, 12.0), (8, 0.035, 22.0, 9.0)):
        common = {**KEY, "split_index": k, "loadgen_result": "VALID", "loadgen_compliance": "not MLPerf-compliant"}
        rows.append({**common, "scenario": "singlestream", "loadgen_latency_p90_s": p90})
        rows.append({**common, "scenario": "offline", "loadgen_samples_per_s": sps})
        rows.append({**common, "scenario": "server", "loadgen_server_qps": qps, "loadgen_latency_bound_s": 0.1,
                     "loadgen_result": "INVALID"})
    return pd.DataFrame(rows)


def test_the_front_is_taken_over_the_scenarios_and_compared_with_the_closed_loops():
    marked = loadgen_front.fronts(_summary()).set_index("split_index")
    assert marked.attrs["objectives"] == {"singlestream_p90_s": "min", "offline_samples_per_s": "max",
                                          "server_qps": "max"}
    assert marked.loc[4, "offline_samples_per_s"] == 45.0 and marked.loc[8, "singlestream_p90_s"] == 0.035
    assert marked.loc[4, "server_result"] == "INVALID" and marked.loc[0, "closed_latency_s"] == 0.030
    assert marked["on_loadgen_front"].to_dict() == {0: False, 4: True, 8: True}
    assert marked["on_closed_front"].to_dict() == {0: True, 4: True, 8: False}
    lines = loadgen_front.describe(marked.reset_index())
    assert lines[0] == ("LoadGen fronts over singlestream_p90_s, offline_samples_per_s, server_qps "
                        "(not MLPerf-compliant):")
    assert lines[1] == "  lan: front 4, 8"
    assert lines[2] == "    server rate (q/s within p99 100 ms): k=0 10.0, k=4 12.0, k=8 9.0"
    assert lines[3] == "    closed-loop front 0, 4; under LoadGen joined: 8; left: 0"


def test_a_session_without_scenarios_has_no_loadgen_front(tmp_path):
    closed = _summary()
    closed = closed[closed["scenario"] == "closed"]
    assert loadgen_front.fronts(closed).empty and loadgen_front.describe(loadgen_front.fronts(closed)) == []
    assert loadgen_front.write(closed, tmp_path).empty and not (tmp_path / loadgen_front.FILE).exists()


def test_predicted_server_rates_join_by_network_and_split_and_the_figure_is_drawn(tmp_path):
    from paretopipe.analysis.plotting import pyplot

    predicted = pd.DataFrame({"network": ["lan"] * 3, "split": [0, 4, 8], "predicted_server_qps": [8.0, 14.5, 7.0],
                              "predicted_server_capacity_qps": [11.0, 16.0, 9.5],
                              "predicted_server_bottleneck": ["link1", "stage2", "stage1"]})
    (tmp_path / "p.csv").write_text(predicted.to_csv(index=False))
    marked = loadgen_front.write(_summary(), tmp_path, loadgen_front.read_predictions(tmp_path / "p.csv"), pyplot())
    assert marked.set_index("split_index")["predicted_server_qps"].to_dict() == {0: 8.0, 4: 14.5, 8: 7.0}
    assert "k=4 12.0 (predicted 14.5)" in loadgen_front.describe(marked)[2]
    written = pd.read_csv(tmp_path / loadgen_front.FILE)
    assert written["predicted_server_bottleneck"].tolist() == ["link1", "stage2", "stage1"]
    assert (tmp_path / "loadgen_front.png").stat().st_size > 10_000
