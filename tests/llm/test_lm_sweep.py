"""A language model on the one sweeper: real stage workers, every configuration's record and
summary row with its token figures, prompt lengths as passes of one group, the fronts of time to
first token against time per token, and ``report`` reading the session back as any other."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import PYTHON
from paretopipe.llm import shapes
from paretopipe.llm.builder import LMBuilder
from paretopipe.llm.summary import decode_bound_s
from paretopipe.transport.runconfig import Generation, RunConfig
from tcp_helpers import run


def _rows(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_a_sweep_measures_every_configuration_and_reports_its_fronts(tmp_path):
    nets = tmp_path / "nets.toml"
    nets.write_text('[lan]\n[slow]\ndelay = "10ms"\nrate = "2mbit"\n')
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "0,3,6", "--network",
               "lan,slow", "--network-file", str(nets), "--prompt-len", "8,32", "--gen-tokens", "4", "--runs", "1",
               "--out", str(tmp_path / "res"), "--session", "s"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    session = tmp_path / "res" / "s"
    rows = _rows(session / "summary.csv")
    assert len(rows) == 2 * 2 * 3 and all(r["status"] == "complete" for r in rows)
    assert sorted({(r["network"], r["prompt_len"]) for r in rows}) == [("lan", "32"), ("lan", "8"), ("slow", "32"),
                                                                       ("slow", "8")]
    records = sorted((session / "runs").glob("*.json"))
    assert len(records) == 12 and all("_p8_" in p.name or "_p32_" in p.name for p in records)
    for path in records:
        rec = json.loads(path.read_text())
        assert rec["status"] == "complete" and [len(t) for t in rec["generation"]["tokens"]] == [4]
    runs = _rows(session / "runs.csv")
    assert {"ttft_median_s", "tpot_median_s", "tokens_per_s", "prompt_len"} <= set(runs[0])
    for r in (r for r in rows if r["network"] == "slow"):  # the link's figures come from the record's manifest
        k = int(r["split_index"])
        assert float(r["bytes_per_token"]) == shapes.cut_bytes_per_token(shapes.named("tiny-lm"), k)
        assert float(r["tpot_bound_s"]) > 0.02 and float(r["ttft_ci95_low_s"]) <= float(r["ttft_median_s"])
    pareto = _rows(session / "report" / "pareto.csv")
    for group in {(r["network"], r["prompt_len"]) for r in pareto}:
        assert any(r["front_status"] == "front" for r in pareto if (r["network"], r["prompt_len"]) == group)
    report = session / "report"
    assert (report / "front_tiny-lm_tcp_p32.png").stat().st_size > 0
    assert (report / "tokens_memory_tiny-lm_tcp_p8.png").stat().st_size > 0
    assert "time to first token" in res.stdout
    again = run([PYTHON, "-m", "paretopipe", "report", str(session)], timeout=120)
    assert again.returncode == 0 and "ttft_median_s" in again.stdout and "prompt_len" in again.stdout


def test_stage_memory_is_parameters_and_the_kv_cache_at_the_full_context():
    shape = shapes.named("tiny-lm")
    builder = LMBuilder("tiny-lm")
    cfg = RunConfig(model="tiny-lm", cuts=["lm3"], split_index=3, generation=Generation(gen_tokens=4, streams=2,
                                                                                         prompt_len=96))
    # split 3: stage 1 holds the embedding and layers 0-1; stage 2 layers 2-3, the norm and the tied head
    params = shapes.block_params(shape)
    kv = 2 * 2 * 16 * 4 * 2 * 100 * 2  # K and V, 2 KV heads of 16, float32, 2 layers, 100 positions, 2 streams
    assert builder.stage_memory(cfg, 0) == {"param_bytes": 4 * sum(params[:3]), "activation_peak_bytes": kv}
    assert builder.stage_memory(cfg, 1) == {"param_bytes": 4 * sum(params[3:]), "activation_peak_bytes": kv}


def test_the_bound_of_a_decode_step_adds_compute_round_trip_and_bytes():
    assert decode_bound_s([0.001, 0.002], 1000, 0.02, 1e6) == pytest.approx(0.001 + 0.002 + 0.02 + 0.001)


@pytest.mark.parametrize("args, needle", [
    (["--batch-size", "4"], "--batch-size applies to an image model"),
    (["--splits", "2,adaptive"], "a language model runs static splits"),
    (["--scenario", "offline"], "--scenario feeds LoadGen's queries as image batches"),
    (["--models", "tiny-lm,mobilenetv2"], "sweep each kind in a session of its own"),
])
def test_what_a_language_model_cannot_take_is_one_line(tmp_path, args, needle):
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--out", str(tmp_path), *args], timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
