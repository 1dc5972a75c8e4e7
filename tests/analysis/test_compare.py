"""paretopipe compare: two sessions' fronts, the deltas, and which splits moved."""

from __future__ import annotations

import pytest

import shutil
import subprocess

import pandas as pd

from conftest import PYTHON, ROOT

FIXTURE = ROOT / "tests" / "analysis" / "fixtures" / "results_small"


def _slower_copy(tmp_path, split: int, factor: float):
    """The fixture with one split's latency and throughput made worse by ``factor`` in every run."""
    dst = tmp_path / "b"
    shutil.copytree(FIXTURE, dst)
    for name in ("runs.csv", "summary.csv"):
        frame = pd.read_csv(dst / name)
        sel = frame["split_index"] == split
        for col in [c for c in frame.columns if c.startswith("latency")]:
            frame.loc[sel, col] *= factor
        for col in [c for c in frame.columns if c.startswith("throughput")]:
            frame.loc[sel, col] /= factor
        frame.to_csv(dst / name, index=False)
    return dst


@pytest.mark.slow
def test_compare_reports_deltas_and_moved_splits(tmp_path):
    from paretopipe.analysis import compare, report

    a_table = report.pareto_table(FIXTURE, resamples=20)
    lan = a_table[(a_table["network"] == "lan") & a_table["on_front"]]
    victim = int(lan["split_index"].iloc[0])
    b = _slower_copy(tmp_path, victim, 10.0)
    result = compare.compare(FIXTURE, b, tmp_path / "cmp")
    points, fronts = result["points"], result["fronts"]
    assert len(points) == len(a_table)  # every configuration is in both
    row = points[(points["network"] == "lan") & (points["split_index"] == str(victim))].iloc[0]
    assert row["latency_s_change"] == __import__("pytest").approx(9.0)
    assert row["throughput_imgs_per_s_change"] == __import__("pytest").approx(-0.9)
    assert row["front"] == "left front"
    untouched = points[points["split_index"] != str(victim)]
    assert (untouched["latency_s_change"].abs() < 1e-12).all()
    lan_front = fronts[fronts["network"] == "lan"].iloc[0]
    assert str(victim) in lan_front["left"].split() and str(victim) not in lan_front["front_b"].split()
    assert lan_front["jaccard"] < 1.0
    assert {p.name for p in (tmp_path / "cmp").iterdir()} >= {"compare_points.csv", "compare_fronts.csv",
                                                              "compare_mobilenet_v2_tcp_b2.png"}

    proc = subprocess.run([PYTHON, "-m", "paretopipe", "compare", str(FIXTURE), str(b)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "left front" in proc.stdout and "+900.0%" in proc.stdout
    same = subprocess.run([PYTHON, "-m", "paretopipe", "compare", str(FIXTURE), str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert same.returncode == 2 and same.stderr.startswith("error: no sweep results under")


@pytest.mark.slow
def test_newest_two_passes_over_sessions_that_did_not_finish(tmp_path):
    """A sweep that failed on its hosts leaves a session folder with an empty summary.csv; the
    comparison of the newest two (make demo's reproducibility line) must not pick it."""
    import json
    import os

    from paretopipe.analysis import compare

    results = tmp_path / "results"
    for i, name in enumerate(("older", "newer", "failed")):
        shutil.copytree(FIXTURE, results / name)
        os.utime(results / name, (1_000 + i, 1_000 + i))
    meta = json.loads((results / "failed" / "session.json").read_text())
    (results / "failed" / "session.json").write_text(json.dumps({**meta, "complete": False, "runs_complete": 0}))
    (results / "failed" / "summary.csv").write_text("\n")
    assert compare.newest_two(results) == (results / "older", results / "newer")
    proc = subprocess.run([PYTHON, "-m", "paretopipe", "compare", str(results)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr


def test_compare_reports_how_fast_each_stage_ran_in_b_relative_to_a(tmp_path):
    """Two sessions on devices whose relative speed moved: stage 1 20% faster in B, stage 2 the
    same. The ratio is paired by configuration, so the splits' different work cancels."""
    from paretopipe.analysis import compare

    dst = tmp_path / "b"
    shutil.copytree(FIXTURE, dst)
    summary = pd.read_csv(dst / "summary.csv")
    summary["stage1_compute_median_s"] *= 0.8
    summary.to_csv(dst / "summary.csv", index=False)
    result = compare.compare(FIXTURE, dst)
    assert result["stage_speed"]["stage1"] == __import__("pytest").approx(0.8)
    assert result["stage_speed"]["stage2"] == __import__("pytest").approx(1.0)
    lines, _ = compare.goals(result, 0.9, {})
    assert lines[-1].startswith("stage compute, B / A (median over shared configurations): stage1 0.80, stage2 1.00")
    assert "stage1 0.80" in compare.format_comparison(result)
