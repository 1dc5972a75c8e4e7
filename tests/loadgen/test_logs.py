"""LoadGen's own logs read into the record's figures: a real LoadGen test (its SUT answers each
sample from a thread after a few milliseconds), then every figure against the summary LoadGen
printed for people."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from paretopipe.loadgen import logs
from loadgen_helpers import run_loadgen
from paretopipe.loadgen.settings import LoadgenOptions

lg = pytest.importorskip("mlperf_loadgen")


def _run(tmp: Path, scenario: str, **kw) -> Path:
    def issue(samples):
        def answer():
            time.sleep(0.003)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in samples])
        threading.Thread(target=answer).start()

    opts = LoadgenOptions.of_flags(scenario, min_duration_s=1, min_query_count=32, **kw)
    return run_loadgen(tmp, opts, issue, expected_latency_s=0.003, expected_qps=200.0, server_qps=50.0)


def _summary_ns(text: str, label: str) -> float:
    return float(re.search(re.escape(label) + r"\s*:\s*([0-9.]+)", text).group(1))


def test_a_singlestream_tests_figures_are_the_ones_its_summary_prints(tmp_path):
    folder = _run(tmp_path, "singlestream")
    fig = logs.figures(logs.read_detail(folder / logs.DETAIL))
    summary = (folder / logs.SUMMARY).read_text()
    assert fig["loadgen_result"] == "VALID" and "Result is : VALID" in summary and fig["loadgen_invalid_reason"] is None
    assert fig["loadgen_latency_p90_s"] == pytest.approx(_summary_ns(summary, "90.0th percentile latency (ns)") / 1e9)
    assert fig["loadgen_latency_p99_s"] == pytest.approx(_summary_ns(summary, "99.00 percentile latency (ns)") / 1e9)
    assert fig["loadgen_early_stopping_p90_s"] == pytest.approx(
        _summary_ns(summary, "Early stopping 90.0th percentile estimate") / 1e9)
    assert fig["loadgen_samples_per_s"] == pytest.approx(_summary_ns(summary, "QPS w/o loadgen overhead"), rel=1e-3)
    assert fig["loadgen_queries"] >= 32 and 0.003 <= fig["loadgen_latency_p50_s"] < 0.1
    assert "p90" in logs.headline("singlestream", fig) and "LoadGen VALID" in logs.headline("singlestream", fig)


def test_an_invalid_tests_reason_names_what_was_not_met(tmp_path):
    # Offline sized for 200 samples/s over 1 s, answered at ~300: the query ends before the minimum duration.
    folder = _run(tmp_path, "offline")
    fig = logs.figures(logs.read_detail(folder / logs.DETAIL))
    assert fig["loadgen_result"] == "INVALID" and "min duration" in fig["loadgen_invalid_reason"]
    assert fig["loadgen_samples_per_s"] == pytest.approx(_summary_ns((folder / logs.SUMMARY).read_text(),
                                                                      "Samples per second"), rel=1e-3)


def test_a_missing_detail_log_is_one_line(tmp_path):
    with pytest.raises(Exception, match="LoadGen wrote no detail log"):
        logs.read_detail(tmp_path / logs.DETAIL)
