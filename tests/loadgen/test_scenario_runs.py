"""LoadGen scenarios through the commands, as real processes: partition1.py with a stage 2 that is
killed mid-test (the run ends in one line, its record written incomplete, nothing hangs),
distributed_runner.py's master on the RPC backend, and a sweep of two scenarios and the closed
loop, whose report draws the LoadGen front beside the closed loop's."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

import tcp_helpers as cli
from conftest import PYTHON
from paretopipe.loadgen import logs

pytest.importorskip("mlperf_loadgen")


def test_a_stage_2_killed_mid_test_ends_the_run_in_one_line_with_its_record_kept(tmp_path):
    port = str(cli.free_port())
    s1 = cli.start("partition1.py", "--model", "mobilenetv2", "--split", "8", "--port", port, "--host", "127.0.0.1",
                   "--batch-size", "1", "--threads", "1", "--scenario", "singlestream", "--min-duration-s", "60",
                   "--out", str(tmp_path))
    s2 = cli.start("partition2.py", "--model", "mobilenetv2", "--port", port, "--host", "127.0.0.1", "--threads", "1",
                   "--out", str(tmp_path / "s2"))
    cli.wait_for_line(s1, "batches measured", 120)  # LoadGen's queries are flowing
    cli.kill_group(s2)
    killed = time.monotonic()
    _, err = s1.communicate(timeout=90)
    assert s1.returncode == 1 and time.monotonic() - killed < 60
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "incomplete" and record["summary"]["batches_measured"] > 0


@pytest.mark.slow
def test_the_rpc_master_runs_a_scenario_and_keeps_its_logs(tmp_path):
    out = cli.run([PYTHON, "distributed_runner.py", "--local", "--world-size", "3", "--model", "mobilenetv2",
                   "--split-block", "8", "--batch-size", "2", "--warmup", "1", "--threads", "1", "--scenario", "offline",
                   "--min-duration-s", "1", "--min-query-count", "12", "--out", str(tmp_path)], timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    s = record["summary"]
    assert record["backend"] == "rpc" and s["loadgen_scenario"] == "offline" and s["loadgen_samples_per_s"] > 0
    assert (record_path.with_name(record_path.stem + ".mlperf") / logs.DETAIL).is_file()
    assert f"{s['loadgen_samples_per_s']:.1f} samples/s" in out.stdout
    measured = [b for b in record["batches"] if not b["warmup"]]
    assert sum(b["images"] for b in measured) == s["loadgen_samples_per_query"] >= 12


@pytest.mark.slow
def test_a_sweep_of_scenarios_reports_the_loadgen_front_beside_the_closed_loops(tmp_path):
    out = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "0,8,19", "--network", "lan",
                   "--scenario", "closed,singlestream,offline", "--runs", "1", "--batch-size", "2", "--num-batches", "6",
                   "--warmup", "1", "--threads", "1", "--min-duration-s", "1", "--min-query-count", "16",
                   "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s"], timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    session = tmp_path / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert sorted(runs["scenario"].unique()) == ["closed", "offline", "singlestream"] and len(runs) == 9
    for _, r in runs[runs["scenario"] != "closed"].iterrows():  # each LoadGen run kept its logs beside it
        assert (session / r["json"].replace(".json", ".mlperf") / logs.SUMMARY).is_file()
        assert r["run_key"].endswith(f"_{r['scenario']}_r0")
    front = pd.read_csv(session / "report" / "loadgen_front.csv")
    assert sorted(front["split_index"]) == [0, 8, 19]
    assert front["singlestream_p90_s"].gt(0).all() and front["offline_samples_per_s"].gt(0).all()
    assert front["on_loadgen_front"].any() and front["on_closed_front"].any()
    # The front is the non-dominated set over p90 (down) and Offline samples/s (up).
    for _, a in front.iterrows():
        dominated = ((front["singlestream_p90_s"] <= a["singlestream_p90_s"])
                     & (front["offline_samples_per_s"] >= a["offline_samples_per_s"])
                     & ((front["singlestream_p90_s"] < a["singlestream_p90_s"])
                        | (front["offline_samples_per_s"] > a["offline_samples_per_s"]))).any()
        assert a["on_loadgen_front"] == (not dominated)
    assert "LoadGen fronts over singlestream_p90_s, offline_samples_per_s (not MLPerf-compliant):" in out.stdout
    assert "closed-loop front" in out.stdout
