"""A language model under LoadGen, through the commands as real processes: partition1.py and
partition2.py over 127.0.0.1 (Offline with two slots that queries take in turn, and the Server's
search under both token bounds), distributed_runner.py's master on the RPC backend, and a sweep of
scenarios whose report draws the token front. Every query's tokens are the unsplit model's for its
prompt, so a slot that serves query after query starts each one clean."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

import tcp_helpers as cli
from conftest import PYTHON
from paretopipe.llm import build, generate, prompts
from paretopipe.loadgen import logs

pytest.importorskip("mlperf_loadgen")
GEN, PROMPT = 6, 12


@pytest.fixture(scope="module")
def unsplit():
    src = build.source("tiny-lm")
    model = generate.reference_model(src)
    cache: dict[int, list[int]] = {}

    def tokens_of(sample: int) -> list[int]:
        if sample not in cache:
            prompt = prompts.seeded_prompt(PROMPT, src.shape.vocab_size, 0, sample)
            cache[sample] = generate.generate_unsplit(model, prompt, GEN)[0]
        return cache[sample]
    return tokens_of


def _pair(tmp_path, split: int, *extra: str):
    port = str(cli.free_port())
    s1 = cli.start("partition1.py", "--model", "tiny-lm", "--split", str(split), "--port", port, "--host", "127.0.0.1",
                   "--prompt-len", str(PROMPT), "--gen-tokens", str(GEN), "--threads", "1", "--sample-count", "16",
                   "--min-duration-s", "1", "--out", str(tmp_path / "s1"), "--connect-timeout", "60", *extra)
    cli.wait_for_line(s1, "listening", 60)
    s2 = cli.start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", port, "--threads", "1",
                   "--out", str(tmp_path / "s2"))
    out, err = s1.communicate(timeout=300)
    s2_out = s2.communicate(timeout=60)
    assert s1.returncode == 0 and s2.returncode == 0, (err[-3000:], s2_out)
    (path,) = (tmp_path / "s1").glob("*.json")
    (s2_path,) = (tmp_path / "s2").glob("*.json")
    return path, json.loads(path.read_text()), json.loads(s2_path.read_text()), out


def _number(text: str, label: str) -> float:
    return float(re.search(re.escape(label) + r"\s*:\s*([0-9.]+)", text).group(1))


def _check_queries(record: dict, unsplit) -> None:
    """Every measured query generated the unsplit model's tokens for its prompt."""
    g = record["generation"]
    assert g["queries"] == len(g["samples"]) == len(g["tokens"]) > 0 and record["status"] == "complete"
    for sample, got in zip(g["samples"], g["tokens"]):
        assert got == unsplit(sample), sample


def test_offline_queries_take_two_slots_in_turn_and_loadgen_counts_their_tokens(tmp_path, unsplit):
    path, record, s2, out = _pair(tmp_path, 3, "--scenario", "offline", "--streams", "2", "--min-query-count", "12")
    _check_queries(record, unsplit)
    s, g = record["summary"], record["generation"]
    summary = (path.with_name(path.stem + ".mlperf") / logs.SUMMARY).read_text()
    assert s["loadgen_tokens_per_s"] == pytest.approx(_number(summary, "Tokens per second"), rel=1e-4)
    # Offline's one query of every sample: each a generation of GEN tokens, a step each.
    assert s["loadgen_queries"] == 1 and g["queries"] == s["loadgen_samples_per_query"] >= 12
    assert g["streams"] == s["streams"] == 2 and sum(map(len, g["tokens"])) == GEN * g["queries"]
    measured = [b for b in record["batches"] if not b["warmup"]]
    assert len(measured) == GEN * g["queries"] == s2["summary"]["batches_measured"]
    assert {b["slot"] for b in measured} == {0, 1} and len({b["stream"] for b in measured}) == g["queries"]
    assert f"{s['loadgen_tokens_per_s']:.1f} tokens/s" in out and "LoadGen offline" in out


def test_the_server_search_holds_both_token_bounds_and_keeps_loadgens_token_percentiles(tmp_path, unsplit):
    path, record, _, out = _pair(tmp_path, 2, "--scenario", "server", "--ttft-ms", "2000", "--tpot-ms", "200",
                                 "--server-steps", "3", "--min-query-count", "16")
    _check_queries(record, unsplit)
    s = record["summary"]
    summary = (path.with_name(path.stem + ".mlperf") / logs.SUMMARY).read_text()
    assert s["loadgen_ttft_p99_s"] == pytest.approx(_number(summary, "99.00 percentile first token latency (ns)") / 1e9)
    assert s["loadgen_tpot_p99_s"] == pytest.approx(_number(summary, "99.00 percentile time to output token (ns)") / 1e9)
    assert (s["loadgen_ttft_bound_s"], s["loadgen_tpot_bound_s"]) == (2.0, 0.2)
    assert "ttft_latency (ns): 2000000000" in summary and "tpot_latency (ns): 200000000" in summary
    steps = record["loadgen"]["steps"]
    assert 1 <= len(steps) <= 3 and s["loadgen_search_steps"] == len(steps)
    passing = [st for st in steps if st["passed"]]
    # tiny-lm answers in milliseconds: some rate holds both bounds, and it is the one reported.
    assert passing and s["loadgen_server_target_qps"] == max(st["target_qps"] for st in passing)
    assert all(st["loadgen_ttft_p99_s"] <= 2.0 and st["loadgen_tpot_p99_s"] <= 0.2 for st in passing)
    assert "within p99 TTFT 2000 ms and TPOT 200 ms" in out


@pytest.mark.slow
def test_the_rpc_master_runs_a_language_models_singlestream(tmp_path, unsplit):
    out = cli.run([PYTHON, "distributed_runner.py", "--local", "--world-size", "2", "--rpc-source", "stage1",
                   "--model", "tiny-lm", "--split-blocks", "4", "--prompt-len", str(PROMPT), "--gen-tokens", str(GEN),
                   "--threads", "1", "--scenario", "singlestream", "--min-duration-s", "1", "--min-query-count", "16",
                   "--sample-count", "16", "--out", str(tmp_path)], timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    _check_queries(record, unsplit)
    s = record["summary"]
    summary = (path.with_name(path.stem + ".mlperf") / logs.SUMMARY).read_text()
    assert record["backend"] == "rpc" and s["loadgen_scenario"] == "singlestream"
    assert s["loadgen_ttft_p90_s"] == pytest.approx(_number(summary, "90.00 percentile first token latency (ns)") / 1e9)
    assert s["loadgen_queries"] == record["generation"]["queries"] >= 16
    assert "LoadGen singlestream: p90 TTFT" in out.stdout


@pytest.mark.slow
def test_a_sweep_of_scenarios_draws_a_language_models_token_front(tmp_path):
    out = cli.run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "1,4", "--network", "lan",
                   "--scenario", "closed,singlestream,offline,server", "--runs", "1", "--prompt-len", str(PROMPT),
                   "--gen-tokens", str(GEN), "--threads", "1", "--min-duration-s", "1", "--min-query-count", "12",
                   "--server-steps", "2", "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s"],
                  timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    session = tmp_path / "s"
    summary = pd.read_csv(session / "summary.csv")
    assert sorted(summary["scenario"].unique()) == ["closed", "offline", "server", "singlestream"]
    lg_rows = summary[summary["scenario"] != "closed"]
    assert lg_rows["loadgen_tokens_per_s"].gt(0).all()
    assert lg_rows[lg_rows["scenario"] != "offline"][["loadgen_ttft_p99_s", "loadgen_tpot_p99_s"]].gt(0).all().all()
    front = pd.read_csv(session / "report" / "loadgen_front.csv")
    assert sorted(front["split_index"]) == [1, 4]
    objectives = {"singlestream_ttft_p90_s": "min", "singlestream_tpot_p90_s": "min", "offline_tokens_per_s": "max",
                  "server_qps": "max"}
    for _, a in front.iterrows():  # the front is the non-dominated set over the four
        better_or_equal = pd.Series(True, index=front.index)
        strictly = pd.Series(False, index=front.index)
        for column, sense in objectives.items():
            col = front[column].fillna(0 if sense == "max" else float("inf"))
            mine = col[a.name]
            better_or_equal &= (col <= mine) if sense == "min" else (col >= mine)
            strictly |= (col < mine) if sense == "min" else (col > mine)
        assert a["on_loadgen_front"] == (not (better_or_equal & strictly).any())
    assert {"closed_ttft_s", "closed_tpot_s", "closed_tokens_per_s"} <= set(front.columns)
    assert ("LoadGen fronts over singlestream_ttft_p90_s, singlestream_tpot_p90_s, offline_tokens_per_s, server_qps"
            in out.stdout)
    assert "within p99 TTFT 2000 ms and TPOT 200 ms" in out.stdout
