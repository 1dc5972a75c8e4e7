"""Objectives by name: their columns, directions and intervals, and each refusal in one line."""

from __future__ import annotations

import pandas as pd
import pytest

from paretopipe.analysis import objectives
from paretopipe.errors import UsageError


def _table(**cols) -> pd.DataFrame:
    return pd.DataFrame({"latency_s": [0.1], "throughput_imgs_per_s": [10.0], **{k: [v] for k, v in cols.items()}})


def test_names_resolve_to_columns_senses_and_intervals():
    table = _table(energy_per_image_j=0.5, energy_modelled_per_image_j=0.4, memory_model_bytes=10,
                   memory_peak_bytes=20, stage1_model_bytes=5, stage2_energy_modelled_per_image_j=0.1)
    got = objectives.parse("latency,throughput,energy,memory,memory_rss,memory_stage1,energy_stage2", table)
    assert [(o.column, o.sense) for o in got] == [
        ("latency_s", "min"), ("throughput_imgs_per_s", "max"), ("energy_per_image_j", "min"),
        ("memory_model_bytes", "min"), ("memory_peak_bytes", "min"), ("stage1_model_bytes", "min"),
        ("stage2_energy_modelled_per_image_j", "min")]
    assert "measured" in got[2].label and "modelled" in got[6].label  # measured first, labelled either way
    assert got[2].interval == ("energy_per_image_ci95_low_j", "energy_per_image_ci95_high_j")
    assert objectives.available(table) == ["latency", "throughput", "energy", "memory", "memory_rss"]


@pytest.mark.parametrize("text, why", [
    ("latency", "two or more different"), ("latency,latency", "two or more different"),
    ("latency,speed", "unknown objective 'speed'"), ("latency,energy", "no energy figure"),
    ("latency,memory", "no peak memory")])
def test_refusals_name_what_is_valid(text, why):
    with pytest.raises(UsageError, match=why) as caught:
        objectives.parse(text, _table())
    assert "valid" in str(caught.value) or "two or more" in str(caught.value)
    if why.startswith("unknown") or why.startswith("two"):
        with pytest.raises(UsageError, match=why):
            objectives.check_names(text)


def test_loadgens_figures_are_objectives_of_a_session_swept_under_a_scenario():
    table = _table(loadgen_ttft_p99_s=0.2, loadgen_tokens_per_s=50.0, loadgen_server_qps=3.0)
    got = objectives.parse("loadgen_ttft_p99,loadgen_tokens,loadgen_server_qps", table)
    assert [(o.column, o.sense) for o in got] == [("loadgen_ttft_p99_s", "min"), ("loadgen_tokens_per_s", "max"),
                                                  ("loadgen_server_qps", "max")]
    assert [objectives.sense(n) for n in ("loadgen_p90", "loadgen_samples", "throughput", "fidelity", "latency")] == \
        ["min", "max", "max", "max", "min"]
    assert {"loadgen_ttft_p99", "loadgen_tokens", "loadgen_server_qps"} <= set(objectives.available(table))
    assert objectives.check_names("loadgen_p90,loadgen_samples") == "loadgen_p90,loadgen_samples"
    with pytest.raises(UsageError, match="no loadgen_latency_p90_s .*--scenario"):
        objectives.parse("loadgen_p90,latency", _table())
