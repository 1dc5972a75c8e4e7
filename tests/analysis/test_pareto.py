"""Pareto analysis: fronts against a brute-force oracle, hypervolume by hand, honest plot labels, notebook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROOT
from notebook_helpers import execute
from paretopipe.analysis import pareto, plotting, report

FIXTURE = Path(__file__).parent / "fixtures" / "results_small"


def oracle(values: np.ndarray, senses) -> np.ndarray:
    """Brute force: i is on the front unless some j is >= on all and > on one (in 'better' terms)."""
    v = values * np.array([1 if s == "min" else -1 for s in senses])
    n = len(v)
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if i != j and np.all(v[j] <= v[i]) and np.any(v[j] < v[i]):
                keep[i] = False
                break
    return keep


grid = st.integers(0, 5).map(float)  # a coarse grid forces ties and exact duplicates


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 3).flatmap(lambda m: st.tuples(
    st.just(m), st.lists(st.lists(st.one_of(grid, st.just(float("nan"))), min_size=m, max_size=m), max_size=25),
    st.lists(st.sampled_from(["a", "b"]), min_size=25, max_size=25),
    st.lists(st.sampled_from(["min", "max"]), min_size=m, max_size=m))))
def test_front_matches_brute_force(case):
    m, rows, groups, senses = case
    cols = [f"o{j}" for j in range(m)]
    df = pd.DataFrame(rows, columns=cols) if rows else pd.DataFrame(columns=cols, dtype=float)
    df["network"] = groups[: len(df)]
    objectives = dict(zip(cols, senses))
    got = pareto.front(df, objectives, by=["network"])
    expected = set()
    nan = df[cols].isna().any(axis=1)
    for _, g in df[~nan].groupby("network"):
        mask = oracle(g[cols].to_numpy(dtype=float), senses)
        expected |= set(g.index[mask])
    assert set(got.index) == expected
    assert got.attrs["excluded_nan"] == int(nan.sum())


def test_front_rules_by_hand():
    df = pd.DataFrame({"latency_s": [1.0, 1.0, 2.0, 1.0, 3.0, np.nan, 0.5],
                       "throughput_imgs_per_s": [10.0, 10.0, 10.0, 9.0, 20.0, 99.0, 1.0],
                       "status": ["complete"] * 6 + ["incomplete"],
                       "network": ["lan"] * 7})
    got = pareto.front(df)
    # 0 and 1 are exact duplicates: both stay. 2 and 3 are weakly dominated (a tie on one axis): out.
    assert sorted(got.index) == [0, 1, 4]
    assert got.attrs["excluded_nan"] == 1 and got.attrs["excluded_failed"] == 1
    single = pareto.front(df.iloc[[2]])
    assert list(single.index) == [2]
    assert pareto.front(df.iloc[0:0]).empty


def test_hypervolume_hand_cases():
    ref = (1.0, 1.0)
    assert pareto.hypervolume_2d(np.array([[0.0, 0.0]]), ref) == pytest.approx(1.0)
    assert pareto.hypervolume_2d(np.array([[0.5, 0.5]]), ref) == pytest.approx(0.25)
    # Two points: union of [0.2,1]x[0.6,1] and [0.6,1]x[0.2,1] = 0.32 + 0.32 - 0.16 = 0.48.
    assert pareto.hypervolume_2d(np.array([[0.2, 0.6], [0.6, 0.2]]), ref) == pytest.approx(0.48)
    # A dominated point and one outside the reference add nothing.
    assert pareto.hypervolume_2d(np.array([[0.2, 0.6], [0.6, 0.2], [0.7, 0.7], [1.5, 0.0]]), ref) == pytest.approx(0.48)
    assert pareto.hypervolume_2d(np.empty((0, 2)), ref) == 0.0
    assert pareto.HV_REFERENCE == (1.1, 1.1)


def test_normalise_and_knee():
    pts = pareto.normalise(np.array([[1.0, 10.0], [3.0, 30.0]]), ["min", "max"], np.array([1.0, 10.0]),
                           np.array([3.0, 30.0]))
    assert pts.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    # A convex front: (0,1), (0.1,0.2), (1,0); the knee is the middle point.
    assert pareto.knee(np.array([[0.0, 1.0], [0.1, 0.2], [1.0, 0.0]])) == 1


def test_robustness_is_one_for_a_clear_winner_and_split_for_a_tie():
    runs = pd.DataFrame({"network": ["p"] * 6, "split_index": [0, 0, 1, 1, 2, 2],
                         "latency_s": [1.0, 1.0, 5.0, 5.0, 1.0, 1.0],
                         "throughput_imgs_per_s": [10.0, 10.0, 1.0, 1.0, 9.0, 11.0]})
    rob = pareto.robustness(runs, ["network", "split_index"], by=["network"], resamples=300)
    assert rob[("p", 0)] > 0.5 and rob[("p", 1)] == 0.0
    assert 0.0 < rob[("p", 2)] < 1.0  # it wins only when its lucky run is drawn


def test_every_plot_label_names_the_point_it_sits_on():
    table = report.pareto_table(FIXTURE, resamples=50)
    points = plotting.front_plot_data(table)
    assert len(points) == len(table)
    for p in points:
        row = table[(table["network"] == p["network"]) & (table["split_index"] == p["split_index"])].iloc[0]
        assert p["label"] == f"k={int(row['split_index'])}"
        assert (p["x"], p["y"]) == (row["latency_s"], row["throughput_imgs_per_s"])
        assert p["on_front"] == bool(row["on_front"])
    for network in table["network"].unique():
        line = plotting.front_line(points, network)
        assert [x for x, _ in line] == sorted(x for x, _ in line)  # drawn in latency order
        assert len(line) == int(table[(table["network"] == network)]["on_front"].sum())
        assert sum(p["knee"] for p in points if p["network"] == network) == 1


@pytest.mark.slow
def test_report_cli_writes_table_and_figures(tmp_path):
    import subprocess

    from conftest import PYTHON

    out = tmp_path / "rep"
    proc = subprocess.run([PYTHON, "-m", "paretopipe.report", str(FIXTURE), "--out", str(out), "--format", "svg"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {"pareto.csv", "front_mobilenet_v2_tcp_b2.svg", "breakdown_mobilenet_v2_tcp_b2.svg",
            "vs_split_mobilenet_v2_tcp_b2.svg", "payload_mobilenet_v2.svg"} <= names
    table = pd.read_csv(out / "pareto.csv")
    assert table["on_front"].any() and "front_robustness" in table and "hypervolume" in table
    bad = subprocess.run([PYTHON, "-m", "paretopipe.report", str(tmp_path / "nothing")], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no sweep results under")


@pytest.mark.slow
def test_notebook_is_saved_with_outputs_and_runs_headless_on_a_fresh_clone():
    """Committed with its outputs (figures included), and it runs with no results folder and no
    settings: a fresh clone falls back to the shipped demo session."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "pareto_front.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "commit it with its outputs"
    assert (ROOT / "examples" / "session-demo" / "summary.csv").is_file()
    if any((ROOT / "results").glob("*/runs.csv")):
        pytest.skip("this checkout has results/, which the notebook prefers to the shipped session")
    text = execute(nb, {"MPLBACKEND": "Agg"})
    assert "session: examples/session-demo" in text and "on a front" in text


def test_notebook_runs_headless_on_the_fixture(tmp_path):
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "pareto_front.ipynb", as_version=4)
    text = execute(nb, {"PARETOPIPE_RESULTS_DIR": str(FIXTURE), "MPLBACKEND": "Agg"})
    assert "on a front" in text and "split_index" in text


def test_hypervolume_in_n_dimensions_is_exact_and_agrees_with_the_2d_sweep():
    import itertools

    import numpy as np

    from paretopipe.analysis.pareto import hypervolume, hypervolume_2d

    # One point at the origin of the unit cube, reference 1 on every axis: volume 1.
    assert hypervolume(np.zeros((1, 4)), [1, 1, 1, 1]) == pytest.approx(1.0)
    # Two points in 3-D: boxes of 0.5 x 1 x 1 and 1 x 0.5 x 1 overlap in 0.5 x 0.5 x 1: union 0.75.
    assert hypervolume(np.array([[0.5, 0, 0], [0, 0.5, 0]]), [1, 1, 1]) == pytest.approx(0.75)
    # A dominated point adds nothing; a point beyond the reference neither.
    assert hypervolume(np.array([[0.5, 0, 0], [0.6, 0.1, 0.2], [1.2, 0, 0]]), [1, 1, 1]) == pytest.approx(0.5)
    rng = np.random.default_rng(3)
    pts = rng.random((12, 2))
    assert hypervolume(pts) == pytest.approx(hypervolume_2d(pts))
    # Inclusion-exclusion over every subset of points is the definition: it agrees in 3-D.
    pts = rng.random((6, 3))
    ref = np.full(3, 1.1)
    exact = 0.0
    for r in range(1, len(pts) + 1):
        for subset in itertools.combinations(pts, r):
            exact += (-1) ** (r + 1) * np.prod(ref - np.max(subset, axis=0))
    assert hypervolume(pts) == pytest.approx(exact)


def test_ties_over_three_objectives_need_the_noise_on_every_one():
    from paretopipe.analysis.pareto import front_status

    # 2 and 3 are both dominated by 1. The noise (median relative half-width) is 9.5% on a, 6.1% on b
    # and 18% on c. 1 beats 2 by less than that on every objective: tied. 1 beats 3 by 67% on c:
    # dominated beyond the noise, however close the two are on a and b.
    df = pd.DataFrame({"model": "m", "split_index": [1, 2, 3],
                       "a": [1.0, 1.05, 1.05], "a_lo": [0.9, 0.95, 0.95], "a_hi": [1.2, 1.15, 1.15],
                       "b": [5.0, 4.9, 4.9], "b_lo": [4.5, 4.6, 4.6], "b_hi": [5.5, 5.2, 5.2],
                       "c": [1.0, 1.1, 3.0], "c_lo": [0.5, 0.9, 2.8], "c_hi": [1.5, 1.3, 3.2]})
    status = front_status(df, {k: (f"{k}_lo", f"{k}_hi") for k in "abc"}, {"a": "min", "b": "max", "c": "min"},
                          ["model"])
    assert list(status) == ["front", "tied", "dominated"]
