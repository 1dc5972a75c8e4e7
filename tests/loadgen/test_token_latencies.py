"""A language model's queries under LoadGen, piece by piece: LoadGen's token latencies read from a
real test's logs (its SUT answers each query's first token, then the rest), the token bounds in
the settings and the Server's pass, what a generation's queries refuse, and the Server rate the
cost model predicts for a split."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from loadgen_helpers import run_loadgen
from paretopipe.errors import UsageError
from paretopipe.loadgen import logs, server_search
from paretopipe.loadgen.settings import LoadgenOptions, make_test_settings
from paretopipe.network.conditions import Direction, NetworkConditions
from paretopipe.predict import lm_costmodel
from paretopipe.transport.runconfig import Generation, RunConfig

lg = pytest.importorskip("mlperf_loadgen")
TOKENS = 5


def _run(tmp: Path, scenario: str) -> Path:
    """A LoadGen test whose SUT gives each query's first token after 4 ms and its other four 2 ms apart."""
    def issue(samples):
        def answer():
            for s in samples:
                time.sleep(0.004)
                lg.FirstTokenComplete([lg.QuerySampleResponse(s.id, 0, 0, 1)])
                time.sleep(0.002 * (TOKENS - 1))
                lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0, TOKENS)])
        threading.Thread(target=answer).start()

    opts = LoadgenOptions.of_flags(scenario, min_duration_s=1, min_query_count=24).for_tokens()
    return run_loadgen(tmp, opts, issue, expected_latency_s=0.006, expected_qps=60.0, server_qps=20.0)


def _ns(text: str, label: str) -> float:
    return float(re.search(re.escape(label) + r"\s*:\s*([0-9.]+)", text).group(1))


def test_the_token_figures_are_the_ones_loadgens_summary_prints(tmp_path):
    folder = _run(tmp_path / "ss", "singlestream")
    fig = logs.figures(logs.read_detail(folder / logs.DETAIL))
    summary = (folder / logs.SUMMARY).read_text()
    assert fig["loadgen_ttft_p90_s"] == pytest.approx(_ns(summary, "90.00 percentile first token latency (ns)") / 1e9)
    assert fig["loadgen_ttft_p99_s"] == pytest.approx(_ns(summary, "99.00 percentile first token latency (ns)") / 1e9)
    assert fig["loadgen_tpot_p90_s"] == pytest.approx(_ns(summary, "90.00 percentile time to output token (ns)") / 1e9)
    assert fig["loadgen_ttft_mean_s"] == pytest.approx(_ns(summary, "Mean First Token latency (ns)") / 1e9)
    # LoadGen's time per output token is the time after the first token over the tokens after it
    # (the SUT's sleeps set the least each can be).
    assert fig["loadgen_tpot_mean_s"] == pytest.approx(
        (fig["loadgen_latency_mean_s"] - fig["loadgen_ttft_mean_s"]) / (TOKENS - 1), rel=1e-3)
    assert 0.002 <= fig["loadgen_tpot_p50_s"] and 0.004 <= fig["loadgen_ttft_p50_s"] < fig["loadgen_latency_p50_s"]
    # Tokens completed over the test's span (the detail log's): at most the summary's rate over the
    # queries' own spans, which leaves out LoadGen's gaps between queries.
    assert 0 < fig["loadgen_tokens_per_s"] <= _ns(summary, "TPS w/o loadgen overhead") * 1.01
    assert "p90 TTFT" in logs.headline("singlestream", fig)
    off = logs.figures(logs.read_detail(_run(tmp_path / "off", "offline") / logs.DETAIL))
    off_summary = (tmp_path / "off" / logs.SUMMARY).read_text()
    assert off["loadgen_tokens_per_s"] == pytest.approx(_ns(off_summary, "Tokens per second"), rel=1e-3)
    assert off["loadgen_tokens_per_s"] == pytest.approx(TOKENS * off["loadgen_samples_per_s"], rel=1e-3)
    assert "tokens/s" in logs.headline("offline", off)
    # An image model's test times no tokens: no token figure appears.
    assert not any("ttft" in k or "tokens" in k for k in logs.figures({"effective_scenario": "Offline"}))


def test_the_settings_carry_the_token_bounds_and_the_server_passes_on_both():
    opts = LoadgenOptions.of_flags("server", ttft_bound_s=0.5, tpot_bound_s=0.05).for_tokens()
    s = make_test_settings(opts, expected_latency_s=0.01, expected_qps=10.0)
    assert s.use_token_latencies and (s.ttft_latency, s.tpot_latency) == (500_000_000, 50_000_000)
    assert opts.query_bound_s(11) == pytest.approx(0.5 + 10 * 0.05)
    default = LoadgenOptions.of_flags("server").for_tokens()
    assert (default.ttft_bound_s, default.tpot_bound_s) == (2.0, 0.2)  # MLPerf's for Llama 2 70B
    assert not make_test_settings(LoadgenOptions.of_flags("server"), expected_latency_s=0.01,
                                  expected_qps=10.0).use_token_latencies
    # Where LoadGen logged no constraint, both token p99s must hold (the query's own bound is not asked).
    held = {"loadgen_ttft_p99_s": 0.4, "loadgen_tpot_p99_s": 0.04, "loadgen_latency_p99_s": 9.0}
    assert server_search.passes(held, 1.0, (0.5, 0.05)) is True
    assert server_search.passes({**held, "loadgen_tpot_p99_s": 0.06}, 1.0, (0.5, 0.05)) is False
    assert server_search.passes({**held, "loadgen_ttft_p99_s": 0.6}, 1.0, (0.5, 0.05)) is False


@pytest.mark.parametrize("kw, says", [
    ({"scenario": "multistream"}, "valid singlestream, offline, server"),
    ({"scenario": "singlestream", "mode": "accuracy"}, "measured by --eval-samples"),
    ({"scenario": "server", "ttft_bound_s": 0.0}, "--ttft-ms 0"),
])
def test_what_a_generations_queries_refuse_is_one_line(kw, says):
    with pytest.raises(UsageError, match=says) as err:
        LoadgenOptions(**kw).for_tokens()
    assert "\n" not in str(err.value)


def test_a_generations_run_takes_whole_queries_as_its_warm_up_and_an_image_run_refuses_token_bounds():
    cfg = RunConfig(model="tiny-lm", cuts=["lm2"], split_index=2, generation=Generation(gen_tokens=6, streams=3),
                    loadgen=LoadgenOptions(scenario="offline"))
    # Each warm-up stream is a query per slot; the exactness check (fixed streams) gives way to LoadGen's queries.
    assert cfg.warmup == 3 * 6 and cfg.loadgen.tokens and not cfg.generation.check_exact
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # the configuration stage 2 is sent means the same
    with pytest.raises(UsageError, match="--ttft-ms and --tpot-ms bound a language model's tokens"):
        RunConfig(model="mobilenetv2", cuts=["k8"], split_index=8, loadgen=LoadgenOptions(scenario="server",
                                                                                          ttft_bound_s=1.0))


def _row(**kw) -> dict:
    row = {"predicted_ttft_s": 0.05, "predicted_tpot_s": 0.01, "stage1_prefill_s": 0.02, "stage2_prefill_s": 0.02,
           "stage1_decode_s": 0.004, "stage2_decode_s": 0.004, "bytes_per_token": 1000, "prompt_len": 100}
    return {**row, **kw}


def test_the_predicted_server_rate_queues_at_the_busiest_resource_of_a_query():
    # One slot: a query holds it 0.05 + 9 x 0.01 = 0.14 s, more than any stage is busy with it (0.056 s).
    one = lm_costmodel.server_columns(_row(), None, 10, 1, 2.0, 0.2)
    assert one["predicted_server_bottleneck"] == "streams"
    assert one["predicted_server_capacity_qps"] == pytest.approx(1 / 0.14)
    assert 0 < one["predicted_server_qps"] < one["predicted_server_capacity_qps"]
    # Four slots: stage 1 (0.02 + 9 x 0.004 = 0.056 s a query) is the busiest.
    four = lm_costmodel.server_columns(_row(), None, 10, 4, 2.0, 0.2)
    assert four["predicted_server_bottleneck"] == "stage1"
    assert four["predicted_server_capacity_qps"] == pytest.approx(1 / 0.056)
    # A slow link: 100 x 1000 B of prompt and 9 x 1000 B of tokens at 1 Mbit/s = 0.872 s a query.
    slow = NetworkConditions("slow", Direction(rate_bps=1e6), Direction(rate_bps=1e6))
    link = lm_costmodel.server_columns(_row(), slow, 10, 4, 2.0, 0.2)
    assert link["predicted_server_bottleneck"] == "link"
    assert link["predicted_server_capacity_qps"] == pytest.approx(1 / 0.872, rel=0.02)
    # Bounds an idle pipeline already misses hold no rate.
    assert lm_costmodel.server_columns(_row(), None, 10, 1, 0.04, 0.2)["predicted_server_qps"] == 0
    assert lm_costmodel.server_columns(_row(), None, 10, 1, 2.0, 0.005)["predicted_server_qps"] == 0
