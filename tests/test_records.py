"""The run record (paretopipe.records): the steady-state throughput and the interval over runs that
summary.csv reports, and the record read back as a checked type."""

from __future__ import annotations


import pytest

from paretopipe import records
from paretopipe.errors import UsageError


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


def test_stage_figures_read_every_stage_in_order_and_work_fields_name_only_work():
    summary = records.summarize([{"seq": 0, "warmup": False, "start_s": 0.0, "end_s": 0.5, "latency_s": 0.5,
                                  "stage1_compute_s": 0.1, "stage2_compute_s": 0.2, "stage3_compute_s": 0.05,
                                  "stage2_wire_bytes": 100}], 1)
    assert records.stage_figures(summary, "compute_median_s") == [0.1, 0.2, 0.05]
    assert records.stage_figures(summary, "nothing_s") == []
    meta = {"stage2_compute_s": 0.2, "stage2_wire_bytes": 100, "result_decode_s": 0.01, "hop_bytes": [1, 2]}
    assert sorted(records.work_fields(meta)) == ["result_decode_s", "stage2_compute_s"]


def test_a_small_file_is_keyed_by_its_resolved_path_and_mtime_and_a_bad_one_named(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("time_s,cpu_share\n0,1\n")
    path, mtime = records.small_file_key(tmp_path / "." / "t.csv", "compute trace", 100)
    assert path == str(good.resolve()) and mtime == good.stat().st_mtime_ns
    assert records.read_text_file(path, "compute trace", "CSV") == "time_s,cpu_share\n0,1\n"
    with pytest.raises(UsageError, match="compute trace not found: .*nope.csv"):
        records.small_file_key(tmp_path / "nope.csv", "compute trace", 100)
    with pytest.raises(UsageError, match="trace .* is not a file"):
        records.small_file_key(tmp_path, "trace", 100)
    with pytest.raises(UsageError, match=r"is 21 bytes; the limit is 10"):
        records.small_file_key(good, "trace", 10)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match=r"is not text \(CSV time_s,cpu_share\)"):
        records.read_text_file(str(binary), "compute trace", "CSV time_s,cpu_share")
    assert records.is_number("1e-3") and records.is_number(" 4 ") and not records.is_number("time_s")
