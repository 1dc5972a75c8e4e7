"""Engines as a dimension of a sweep (paretopipe.engines), read back by the report's engine
figures (paretopipe.analysis.engine_fronts): each engine is a configuration of its own, in the key,
the file names, runs.csv and summary.csv (with its error against torch), each engine has its own
front and knee on one figure per setting, and a stage that does not export fails its configuration
while the sweep goes on."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import PYTHON, unexportable_model
import tcp_helpers as cli
from paretopipe.analysis import engine_fronts


def _sweep(tmp_path, model: str, *extra: str):
    return cli.run([PYTHON, "-m", "paretopipe", "sweep", "--model", model, "--network", "lan", "--runs", "2",
                    "--batch-size", "2", "--num-batches", "3", "--warmup", "1", "--threads", "1", "--out",
                    str(tmp_path), "--session", "s", "--local", "--quiet", *extra], timeout=600)


@pytest.mark.slow
def test_a_sweep_over_engines_keys_reports_and_draws_each_engines_front(tmp_path):
    proc = _sweep(tmp_path, "examples/models/skipnet.py:build", "--splits", "1,3", "--engine",
                  "torch,onnxruntime,openvino")
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "s"
    summary = pd.read_csv(session / "summary.csv")
    assert sorted(summary["engine"]) == sorted(["torch", "onnxruntime", "openvino"] * 2)
    assert set(summary["runs"]) == {2}
    torch_rows, engine_rows = summary[summary.engine == "torch"], summary[summary.engine != "torch"]
    assert torch_rows["engine_max_rel_error"].isna().all()  # torch is its own reference
    assert (engine_rows["engine_max_rel_error"] < 1e-4).all()
    names = sorted(p.name for p in (session / "runs").glob("*.json"))
    assert "examples_models_skipnet.py_build_tcp_lan_k01_onnxruntime_r0.json" in names
    assert "examples_models_skipnet.py_build_tcp_lan_k01_r0.json" in names
    record = json.loads((session / "runs" / "examples_models_skipnet.py_build_tcp_lan_k03_openvino_r1.json").read_text())
    assert [s["engine"]["engine"] for s in record["manifest"]["stages"]] == ["openvino", "openvino"]
    assert record["manifest"]["stages"][0]["engine"]["threads"] == 1  # --threads is the engine's too
    report = session / "report"
    knees = pd.read_csv(report / engine_fronts.ENGINES_FILE)
    assert sorted(knees["engine"]) == ["onnxruntime", "openvino", "torch"]
    assert knees["knee_split"].isin([1, 3]).all()
    assert (report / "engines_examples_models_skipnet.py_build_tcp_b2.png").stat().st_size > 10_000
    assert (report / "front_examples_models_skipnet.py_build_tcp_b2_onnxruntime.png").is_file()  # each engine's own panel too
    pareto = pd.read_csv(report / "pareto.csv")
    assert pareto.groupby("engine")["on_front"].any().all()  # a front per engine


@pytest.mark.slow
def test_a_stage_that_does_not_export_fails_its_configuration_and_the_sweep_goes_on(tmp_path):
    model = unexportable_model(tmp_path)
    proc = _sweep(tmp_path, model, "--splits", "1", "--engine", "torch,onnxruntime")
    session = tmp_path / "s"
    summary = pd.read_csv(session / "summary.csv")  # torch's configuration alone completed
    assert summary["status"].tolist() == ["complete"] and summary["runs"].tolist() == [2], proc.stderr[-2000:]
    failures = pd.read_csv(session / "failures.csv")
    assert len(failures) and failures["run_key"].str.contains("_k01_onnxruntime_r").any()
    assert failures["run_key"].str.contains("_onnxruntime_").all()
    assert failures["error"].str.contains("operator aten::cumprod is not supported").all()
    assert "stage 2 of" in failures["error"].iloc[0]


def test_knees_per_engine_from_a_table():
    """The knees table on a hand-made front table: each engine's knee and front per network."""
    rows = []
    for engine, speed in (("torch", 1.0), ("onnxruntime", 3.0)):
        for k, lat, thr, front, knee in ((2, 0.03, 30.0, True, engine == "torch"), (5, 0.02, 40.0, True,
                                         engine != "torch"), (7, 0.05, 10.0, False, False)):
            rows.append({"model": "m", "backend": "tcp", "cipher": "none", "transport": "tcp", "batch_size": 1,
                         "codec": "float32/none", "in_flight": 1, "scenario": "closed", "prompt_len": 0,
                         "fault": "none", "placement": "in-order", "engine": engine, "network": "lan",
                         "split_index": k, "latency_s": lat / speed, "throughput_imgs_per_s": thr * speed,
                         "on_front": front, "knee": knee})
    knees = engine_fronts.knees(pd.DataFrame(rows)).set_index("engine")
    assert knees.loc["torch", "knee_split"] == 2 and knees.loc["onnxruntime", "knee_split"] == 5
    assert knees.loc["torch", "front_splits"] == "2 5"
    assert knees.loc["onnxruntime", "knee_throughput_imgs_per_s"] == pytest.approx(120.0)
