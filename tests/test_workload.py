"""The workload as one value (issue 68): a record, a runs.csv row and a summary.csv row say which
they are, and a table read back knows its workload from its rows, not from a column's presence."""

from __future__ import annotations

import pandas as pd
import pytest

from paretopipe import workload
from paretopipe.analysis import objectives
from paretopipe.analysis.summarize import summarize_runs
from paretopipe.errors import UsageError
from paretopipe.workload import GENERATION, IMAGES


def test_a_record_says_its_workload_by_its_generation_settings():
    assert workload.of_record({"config": {"model": "mobilenet_v2"}}) is IMAGES
    assert workload.of_record({"config": {"model": "tiny-llama", "generation": {"gen_tokens": 8}}}) is GENERATION
    assert workload.of_generation(None) is IMAGES and workload.of_generation(object()) is GENERATION


def test_a_table_knows_its_workload_from_its_rows_whatever_columns_it_has():
    # A generation's summary whose time per token is empty (every run infeasible) is still one.
    table = pd.DataFrame({"workload": ["generation", "generation"], "tpot_median_s": [None, None]})
    assert workload.of_table(table) is GENERATION
    assert objectives.defaults(table) == ("ttft", "tpot") and objectives.throughput_column(table) == "tokens_per_s"
    # An image table that happens to carry an empty token column is images.
    images = pd.DataFrame({"workload": ["images"], "tpot_median_s": [None], "latency_s": [0.1]})
    assert workload.of_table(images) is IMAGES and [o.name for o in objectives.main_pair(images)] == [
        "latency", "throughput"]
    with pytest.raises(UsageError, match="--objectives ttft: not an objective of this session's workload, images"):
        objectives.resolve("ttft", images)


def test_a_table_from_before_rows_carried_it_is_read_by_its_time_per_token():
    assert workload.of_table(pd.DataFrame({"tpot_median_s": [0.02]})) is GENERATION
    assert workload.of_table(pd.DataFrame({"latency_s": [0.1]})) is IMAGES


def test_mixed_workloads_and_unknown_names_are_refused_in_one_line():
    with pytest.raises(UsageError, match=r"this table mixes workloads \(generation, images\)"):
        workload.of_table(pd.DataFrame({"workload": ["images", "generation"]}))
    with pytest.raises(UsageError, match="unknown workload 'audio': valid images, generation"):
        workload.named("audio")


def test_summary_rows_carry_their_runs_workload():
    row = {"model": "tiny-llama", "backend": "tcp", "network": "lan", "split_index": "2", "cut": "", "status": "complete",
           "batch_size": 1, "in_flight": 1, "latency_median_s": 0.1, "throughput_imgs_per_s": 10.0,
           "workload": "generation"}
    (summary,) = summarize_runs([row, {**row, "latency_median_s": 0.12}])
    assert summary["workload"] == "generation" and summary["runs"] == 2


def test_each_workload_refuses_the_others_settings_and_names_them_all():
    """The checks of a sweep, a run and a data source ask a workload why, not which kind it is."""
    assert IMAGES.refusal("adaptive") is None and GENERATION.refusal("token_bounds") is None
    assert "--latency-bound-ms" in IMAGES.refusal("token_bounds")
    assert "drop adaptive from --splits" in GENERATION.refusal("adaptive")
    # every setting is one workload's own: refused by exactly one of the two
    assert all((IMAGES.refusal(s) is None) != (GENERATION.refusal(s) is None) for s in workload.SETTINGS)
    with pytest.raises(UsageError, match="^a language model's stages run on torch"):
        GENERATION.refuse(token_bounds=True, engines=True)
    IMAGES.refuse(adaptive=True, engines=True)  # an image model takes both
    IMAGES.refuse(eval_text=None, token_bounds=False)  # settings not given are not refused
    with pytest.raises(KeyError, match="no workload setting 'batch'"):
        IMAGES.refusal("batch")


def test_a_configurations_key_takes_its_batch_and_window_from_the_workloads_own_options():
    from paretopipe.controller.sweep import SweepOptions

    images = SweepOptions(models=["mobilenetv2"], batch_size=4, in_flight=3, streams=5)
    language = SweepOptions(models=["tiny-lm"], batch_size=4, in_flight=3, streams=5)
    assert images.workload is IMAGES and language.workload is GENERATION
    assert (IMAGES.batch_of(images), IMAGES.window_of(images)) == (4, 3)
    assert (GENERATION.batch_of(language), GENERATION.window_of(language)) == (1, 5)  # a step: one token a stream
    assert IMAGES.dataset is None and GENERATION.dataset == "synthetic"
