"""Several testbeds' sessions of one shared study merged by ``paretopipe report A B``: the
configurations with their testbeds, one front over all, and a configuration both testbeds
measured flagged when their 95% intervals do not overlap (and not judged on one run)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import PYTHON
from paretopipe.analysis import objectives, testbeds
from paretopipe.errors import UsageError
import tcp_helpers as cli


def _session(folder: Path, testbed: str, rows: list[tuple[str, float, float, float, int]]) -> Path:
    """A session whose summary holds (split, latency, its CI half-width, throughput, runs) rows."""
    folder.mkdir(parents=True)
    summary = [{"model": "mobilenet_v2", "backend": "tcp", "cipher": "none", "transport": "tcp", "network": "lan",
                "batch_size": 1, "split_index": split, "codec": "float32/none", "in_flight": 1, "status": "complete",
                "runs": runs,
                "latency_median_s": lat, "latency_median_ci95_low_s": lat - half,
                "latency_median_ci95_high_s": lat + half, "throughput_imgs_per_s": thr,
                "throughput_ci95_low_imgs_per_s": thr * 0.98, "throughput_ci95_high_imgs_per_s": thr * 1.02}
               for split, lat, half, thr, runs in rows]
    pd.DataFrame(summary).to_csv(folder / "summary.csv", index=False)
    pd.DataFrame([{"split_index": r[0], "status": "complete"} for r in rows]).to_csv(folder / "runs.csv", index=False)
    (folder / "search.json").write_text(json.dumps({"testbed": testbed}))
    return folder


def test_testbeds_are_merged_into_one_front_and_a_shared_configuration_is_judged_by_its_intervals(tmp_path):
    a = _session(tmp_path / "a", "pi-pair-1", [("12", 0.060, 0.002, 16.0, 3), ("0", 0.040, 0.002, 24.0, 3),
                                               ("6", 0.050, 0.002, 18.0, 3)])
    b = _session(tmp_path / "b", "pi-pair-2", [("12", 0.075, 0.002, 13.0, 3), ("19", 0.045, 0.002, 30.0, 3),
                                               ("6", 0.051, 0.003, 18.2, 3)])
    table, flags = testbeds.write([a, b], tmp_path / "out")
    assert set(table["testbed"]) == {"pi-pair-1", "pi-pair-2"}
    front = table[table["on_front"]]
    # One front over both testbeds: split 0 (pi-pair-1) is fastest, split 19 (pi-pair-2) has the most throughput.
    assert sorted(zip(front["split_index"].astype(str), front["testbed"])) == [("0", "pi-pair-1"), ("19", "pi-pair-2")]
    judged = {str(r["split_index"]): r for _, r in flags.iterrows()}
    assert set(judged) == {"12", "6"}                      # measured on both
    assert judged["12"]["disagree"] and judged["12"]["disagree_on"] == "latency,throughput"
    assert not judged["6"]["disagree"]                     # 50 +- 2 and 51 +- 3 ms overlap
    written = pd.read_csv(tmp_path / "out" / testbeds.DISAGREEMENTS)
    assert list(written["disagree"]) == [False, True] or list(written["disagree"]) == [True, False]
    lines = testbeds.describe(table, flags, ["latency", "throughput"])
    assert "DISAGREE on latency,throughput" in "\n".join(lines) and "agree within their intervals" in "\n".join(lines)


def test_one_run_is_not_judged_and_two_sessions_of_one_testbed_are_refused(tmp_path):
    a = _session(tmp_path / "a", "bench", [("12", 0.060, 0.0, 16.0, 1)])
    b = _session(tmp_path / "b", "bench-2", [("12", 0.090, 0.0, 11.0, 1)])
    merged = testbeds.merge([a, b])
    flags = testbeds.disagreements(merged, objectives.parse(None, merged))
    (row,) = flags.to_dict("records")
    assert row["disagree"] is None and row["disagree_on"] == "not judged: one run on bench, bench-2"
    c = _session(tmp_path / "c", "bench", [("6", 0.05, 0.0, 18.0, 1)])
    with pytest.raises(UsageError, match="two of these sessions are the same testbed"):
        testbeds.merge([a, c])


def test_report_with_several_sessions_prints_the_merged_testbeds(tmp_path):
    a = _session(tmp_path / "a", "pi-pair-1", [("12", 0.060, 0.002, 16.0, 3), ("0", 0.040, 0.002, 24.0, 3)])
    b = _session(tmp_path / "b", "pi-pair-2", [("12", 0.075, 0.002, 13.0, 3)])
    done = cli.run([PYTHON, "-m", "paretopipe", "report", str(a), str(b)], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "testbeds: 2 (pi-pair-1: 2 configurations, pi-pair-2: 1 configuration)" in done.stdout
    assert "split 12 (lan) measured on pi-pair-1,pi-pair-2: DISAGREE on latency,throughput" in done.stdout
    assert (a / "report-testbeds" / testbeds.FILE_NAME).is_file()
