"""The session folder has one owner: records in, CSVs out, unreadable records skipped and named."""

from __future__ import annotations

import json

import pytest

from paretopipe import records
from paretopipe.analysis.session import CONFIG_KEY, Session, config_key, find_session, run_key
from paretopipe.errors import UsageError


def _record(run: int, k: int, latency: float) -> dict:
    cfg_key = config_key("mobilenet_v2", "tcp", "lan", k)
    batches = [{"seq": i, "warmup": False, "start_s": i * 0.1, "end_s": i * 0.1 + latency, "latency_s": latency}
               for i in range(4)]
    return records.build_run_record(
        backend="tcp", run_id=f"r{run}k{k}", status="complete", error=None,
        config={"model": "mobilenet_v2", "cuts": ["c"], "split_index": k, "batch_size": 1, "in_flight": 1,
                "network": "lan", "run_key": run_key(cfg_key, run), "config_key": cfg_key, "run": run},
        manifest={"stages": [], "link": {"mode": "emulated"}}, batches=batches, sysmon={})


def test_consolidation_from_records_and_truncated_ones_are_skipped(tmp_path):
    s = Session(tmp_path / "s")
    for run in (0, 1):
        for k, lat in ((0, 0.2), (3, 0.1)):
            s.write_run(run_key(config_key("mobilenet_v2", "tcp", "lan", k), run), _record(run, k, lat + run / 100))
    (s.runs_dir / "broken.json").write_text('{"summary": {"lat')
    rows, skipped = s.consolidate([{"run_key": "x", "attempt": 1, "error": "e", "time_utc": "t"}], final=True)
    assert skipped == ["broken.json"] and len(rows) == 4
    assert rows[0]["config_key"] == "mobilenet_v2_tcp_lan_k00" and rows[0]["json"].startswith("runs/")
    configs = s.configs()
    assert list(configs[CONFIG_KEY].itertuples(index=False, name=None)) == [
        ("mobilenet_v2", "tcp", "lan", 1, 0), ("mobilenet_v2", "tcp", "lan", 1, 3)]
    assert configs["runs"].tolist() == [2, 2]
    assert configs.loc[0, "latency_median_s"] == pytest.approx(0.205)
    assert s.completed("mobilenet_v2_tcp_lan_k03_r1") and not s.completed("nope")
    assert find_session(tmp_path).path == s.path


def test_meta_round_trip_and_bad_folders(tmp_path):
    s = Session(tmp_path / "s")
    assert s.read_meta() is None
    s.write_meta({"a": 1})
    assert s.read_meta() == {"a": 1}
    s.meta_path.write_text("[1, 2")
    with pytest.raises(UsageError, match="not readable JSON"):
        s.read_meta()
    with pytest.raises(UsageError, match="no sweep results under .*no such folder"):
        find_session(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        find_session(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "runs.csv").write_text("")
    with pytest.raises(UsageError, match="not a readable CSV"):
        Session(tmp_path / "empty").runs()
    json.dumps(_record(0, 0, 0.1))  # a record is plain JSON


def _batches(warmup: int, n: int, fill_s: float, every_s: float) -> list[dict]:
    """A pipeline of ``warmup + n`` batches: all start at once (a deep window), the first result
    comes back after ``fill_s`` and the rest every ``every_s``."""
    return [{"seq": i, "warmup": i < warmup, "start_s": 0.0, "end_s": fill_s + i * every_s,
             "latency_s": fill_s + i * every_s} for i in range(warmup + n)]


def test_throughput_is_the_steady_state_with_or_without_warm_up():
    # A sweep warms a cut up on its first run only; both runs must measure the same throughput,
    # and neither may charge the pipeline's fill (here 0.2 s) to its window.
    warm = records.summarize(_batches(warmup=1, n=10, fill_s=0.2, every_s=0.05), batch_size=1)
    cold = records.summarize(_batches(warmup=0, n=10, fill_s=0.2, every_s=0.05), batch_size=1)
    assert warm["throughput_imgs_per_s"] == pytest.approx(20.0)
    assert cold["throughput_imgs_per_s"] == pytest.approx(20.0)
    assert cold["measured_window_s"] == pytest.approx(9 * 0.05)
    # The span, fill included, is what a sweep counts as time spent measuring.
    assert cold["measured_span_s"] == pytest.approx(0.2 + 9 * 0.05)
    one = records.summarize(_batches(warmup=0, n=1, fill_s=0.2, every_s=0.05), batch_size=4)
    assert one["throughput_imgs_per_s"] == pytest.approx(4 / 0.2)


def test_the_interval_over_runs_holds_the_median_95_percent_of_the_time_at_three_runs():
    """summary.csv's CIs (records.median_ci) are honest at the few runs a sweep affords: over
    log-normal runs with this machine's 20% spread, 95% of them hold the true median at 3 and 4
    runs, where the percentile bootstrap of the median held it 74% and 89% of the time."""
    import numpy as np

    rng = np.random.default_rng(7)
    for n, bootstrap_cover in ((3, 0.80), (4, 0.92)):
        hits = boot = 0
        for trial in range(600):
            xs = list(0.05 * np.exp(rng.normal(0.0, 0.2, n)))
            lo, hi = records.median_ci(xs)
            assert lo <= float(np.median(xs)) <= hi  # the point every table shows lies inside
            hits += lo <= 0.05 <= hi
            blo, bhi = records.bootstrap_ci(xs, seed=trial, resamples=300)
            boot += blo <= 0.05 <= bhi
        assert 0.92 <= hits / 600 <= 0.98, (n, hits / 600)
        assert boot / 600 < bootstrap_cover, (n, boot / 600)
    assert records.median_ci([0.3]) == (0.3, 0.3)  # one run: no spread to speak of
    assert records.median_ci([]) == (None, None)
    lo, hi = records.median_ci([0.0, 1.0, 2.0])  # a zero has no log: a t interval on the values
    assert lo < 0.0 and hi > 2.0 and lo + hi == pytest.approx(2.0)
