"""validate(): a recorded session against device profiles gives exact, hand-checked errors and
Jaccard values. The measured values are built from the cost model's own predictions with chosen
errors, so every figure the validation reports is known in advance; how well predictions agree
with a real sweep on this machine is a measurement (benchmarks/prediction_accuracy.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from paretopipe.analysis.session import Session
from paretopipe.network.conditions import conditions_from_values
from paretopipe.predict import validate as predict
from paretopipe.predict.costmodel import LinkModel, chain_terms, simulate
from paretopipe.predict.device_profile import synthetic_profile

SEGMENTS, BYTES = [0.010, 0.020], [1000, 500, 10]
OPTIONS = {"num_batches": 4, "warmup": 1, "in_flight": 1, "wire_dtype": "float32", "compression": "none"}
#: Per split: (latency error, throughput error) chosen for the recorded session.
ERRORS = {0: (0.20, 0.50), 1: (0.10, 0.25), 2: (0.00, 0.00)}


def _recorded_session(tmp_path):
    """A session as the sweeper writes it: session.json, summary.csv and runs.csv (one run each)."""
    profile = synthetic_profile(SEGMENTS, BYTES)
    slow = conditions_from_values("slow", {"rate": "8mbit"})
    up, down = LinkModel.pair(slow, {})
    rows, predicted = [], {}
    for k, (e_lat, e_thr) in ERRORS.items():
        terms = chain_terms([profile, profile], [up], [k], 1, "float32/none", [down])
        sim = simulate(terms, OPTIONS["num_batches"], OPTIONS["warmup"], OPTIONS["in_flight"])
        predicted[k] = sim
        # |predicted - measured| / measured = error exactly when measured = predicted / (1 + error).
        rows.append({"model": "mobilenet_v2", "backend": "tcp", "network": "slow", "batch_size": 1, "split_index": k,
                     "cut": f"cut{k}", "run": 0, "status": "complete",
                     "latency_median_s": sim["predicted_latency_s"] / (1 + e_lat),
                     "throughput_imgs_per_s": sim["predicted_throughput_imgs_per_s"] / (1 + e_thr)})
    session = tmp_path / "s"
    session.mkdir()
    (session / "session.json").write_text(json.dumps({"options": OPTIONS, "networks": {"slow": slow.to_dict()}}))
    pd.DataFrame(rows).to_csv(session / "summary.csv", index=False)
    pd.DataFrame(rows).to_csv(session / "runs.csv", index=False)
    return session, profile, predicted


def test_validation_reports_the_chosen_errors_and_fronts_exactly(tmp_path):
    session, profile, predicted = _recorded_session(tmp_path)
    table, summary = predict.validate(session, [profile, profile])
    table = table.set_index("split_index")
    for k, (e_lat, e_thr) in ERRORS.items():
        assert table.loc[k, "latency_ape"] == pytest.approx(e_lat, abs=1e-12)
        assert table.loc[k, "throughput_ape"] == pytest.approx(e_thr, abs=1e-12)
    assert summary["configurations"] == 3
    assert summary["latency_median_ape"] == pytest.approx(0.10) and summary["throughput_median_ape"] == pytest.approx(0.25)
    # Predicted: k=2 is fastest and most productive (the logits are all that cross the link), so it
    # alone is the predicted front. Measured (with the errors): k=0 has the lowest latency, k=2
    # the highest throughput, and k=1 lies between them on both: all three are on the front.
    lat = {k: v["predicted_latency_s"] for k, v in predicted.items()}
    thr = {k: v["predicted_throughput_imgs_per_s"] for k, v in predicted.items()}
    assert min(lat, key=lat.get) == 2 and max(thr, key=thr.get) == 2
    net = summary["per_network"]["slow"]
    assert net["predicted_front"] == [2] and net["measured_front"] == [0, 1, 2] and net["measured_tied"] == []
    assert net["jaccard"] == pytest.approx(1 / 3) and net["strict_jaccard"] == pytest.approx(1 / 3)
    assert net["missed"] == [0, 1] and net["beyond_noise"] == []
    assert summary["front_jaccard_mean"] == pytest.approx(1 / 3)
    assert summary["goals_met"] is False and summary["goals"]["median_ape_max"] == predict.GOAL_MAPE
    assert summary["run_to_run_jaccard_mean"] is None  # one run per configuration: no ceiling to compute
    written = predict.write_validation(table.reset_index(), summary, tmp_path / "report")
    assert [p.name for p in written] == ["prediction_validation.csv", "prediction_validation.json",
                                         "prediction_validation.png"]
    assert json.loads(written[1].read_text())["configurations"] == 3


def _runs_session(tmp_path, points_per_run):
    session = tmp_path / "s"
    session.mkdir()
    rows = []
    for run, points in enumerate(points_per_run):
        for k, (lat, thr) in points.items():
            rows.append({"backend": "tcp", "status": "complete", "network": "lan", "run": run, "split_index": k,
                         "latency_median_s": lat, "throughput_imgs_per_s": thr, "model": "m", "batch_size": 1})
    pd.DataFrame(rows).to_csv(session / "runs.csv", index=False)
    return Session(session)


def test_a_sweep_whose_runs_agree_reproduces_its_front_and_one_whose_runs_swap_the_best_does_not(tmp_path):
    """Two sweeps drawn from the runs (bootstrap resamples of each configuration's runs): where every
    run has the same front, every draw has it too (1.0); where the runs swap which split has the best
    throughput, the draws' fronts disagree, and by how much depends on how often they swap."""
    steady = _runs_session(tmp_path, [{1: (0.010, 50), 2: (0.020, 80), 3: (0.030, 40)}] * 4)
    assert predict.run_to_run_jaccard(steady) == {"lan": 1.0}
    swapping = tmp_path / "swap"
    swapping.mkdir()
    flips = _runs_session(swapping, [{1: (0.010, 50), 2: (0.020, 80), 3: (0.020, 40)},
                                     {1: (0.010, 50), 2: (0.020, 40), 3: (0.020, 80)}] * 2)
    agreement = predict.run_to_run_jaccard(flips)["lan"]
    assert 0.3 < agreement < 0.9
    # Within a noise as large as the swap, 2 and 3 cannot be told apart: every draw keeps both.
    assert predict.run_to_run_jaccard(flips, {"lan": [0.05, 0.6]}) == {"lan": 1.0}


def test_a_lossy_wire_is_predicted_with_its_own_codec_and_shown_with_what_it_kept(tmp_path):
    """A session's int8 configurations are priced with the profile's int8 timings (not the
    session's first dtype), form a front of their own, and carry their measured agreement."""
    session, profile, _ = _recorded_session(tmp_path)
    rows = pd.read_csv(session / "summary.csv")
    int8 = rows.assign(codec="int8/none", fidelity_top1_agreement=[0.5, 0.75, 1.0], fidelity_kl_mean=0.01)
    both = pd.concat([rows.assign(codec="float32/none"), int8])
    both.to_csv(session / "summary.csv", index=False)
    both.to_csv(session / "runs.csv", index=False)
    by_batch = profile.doc["by_batch"]["1"]["codecs"]
    by_batch["int8/none"] = [{**r, "frame_bytes": r["frame_bytes"] // 4, "wire_bytes": r["wire_bytes"] // 4}
                             for r in by_batch["float32/none"]]
    table, summary = predict.validate(session, [profile, profile])
    assert set(summary["per_network"]) == {"slow", "slow (int8/none)"}
    lossy = table[table["codec"] == "int8/none"].set_index("split_index")
    plain = table[table["codec"] == "float32/none"].set_index("split_index")
    assert (lossy["predicted_latency_s"] < plain["predicted_latency_s"]).all()  # a quarter of the bytes
    assert lossy["fidelity_top1_agreement"].tolist() == [0.5, 0.75, 1.0]
    assert predict.kept_line(table, "slow (int8/none)").endswith("k=0 0.500, k=1 0.750, k=2 1.000")
    assert predict.kept_line(table, "slow") is None
