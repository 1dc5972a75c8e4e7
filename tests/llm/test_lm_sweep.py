"""A language-model sweep on this machine: real stages (stage 1 here, the last stage a process of
its own), every configuration's record and summary row, an infeasible context recorded and not
run, fronts marked per network, and ``report`` reading the session back."""

from __future__ import annotations

import csv
import json

from conftest import PYTHON
from paretopipe.analysis import lm_fronts
from paretopipe.llm import shapes
from paretopipe.runners.lm_sweep import LMSweepOptions, infeasible_why, stage_memory_bytes
from tcp_helpers import run


def test_a_sweep_measures_every_configuration_and_reports_its_fronts(tmp_path):
    nets = tmp_path / "nets.toml"
    nets.write_text('[lan]\n[slow]\ndelay = "10ms"\nrate = "2mbit"\n')
    # One stage holds the whole of tiny-lm at splits 0 and 6: 0.659 MB of parameters, and a KV cache of
    # 12 kB at 8 + 4 tokens, 36 kB at 32 + 4: over 680 kB only with the longer prompt.
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "0,3,6", "--network",
               "lan,slow", "--network-file", str(nets), "--prompt-len", "8,32", "--gen-tokens", "4",
               "--memory-limit", "680kB,680kB", "--out", str(tmp_path / "res"), "--session", "s"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    session = tmp_path / "res" / "s"
    with open(session / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 3
    infeasible = [r for r in rows if r["status"] == "infeasible"]
    assert [(r["network"], r["prompt_len"], r["split"]) for r in infeasible] == [
        ("lan", "32", "0"), ("lan", "32", "6"), ("slow", "32", "0"), ("slow", "32", "6")]
    assert "stage 2 needs 0.7 MB" in infeasible[0]["note"] and "stage 1 needs" in infeasible[1]["note"]
    records = sorted((session / "runs").glob("*.json"))
    assert len(records) == 8
    for path in records:
        rec = json.loads(path.read_text())
        assert rec["status"] == "complete" and len(rec["tokens"][0]) == 4
    slow = [r for r in rows if r["network"] == "slow" and r["status"] == "complete"]
    for r in slow:  # the link's figures come from the record's manifest
        assert float(r["rtt_s"]) == 0.02 and float(r["rate_bytes_per_s"]) == 250000
        k = int(r["split"])
        assert float(r["bytes_per_token"]) == shapes.cut_bytes_per_token(shapes.named("tiny-lm"), k)
        assert float(r["bound_s"]) > 0.02
    for group in {(r["network"], r["prompt_len"]) for r in rows if r["status"] == "complete"}:
        members = [r for r in rows if (r["network"], r["prompt_len"]) == group and r["status"] == "complete"]
        assert any(r["front_ttft_tpot"] == "True" for r in members)
    assert "time to first token" in res.stdout and (session / "report" / "lm_ttft_vs_tpot.png").stat().st_size > 0
    again = run([PYTHON, "-m", "paretopipe", "report", str(session)], timeout=120)
    assert again.returncode == 0 and "tiny-lm on slow, prompt 32 tokens" in again.stdout


def test_stage_memory_is_parameters_and_kv_cache():
    shape = shapes.named("tiny-lm")
    # split 3: stage 1 holds the embedding and layers 0-1; stage 2 layers 2-3, the norm and the tied head
    params = shapes.block_params(shape)
    assert stage_memory_bytes(shape, 3, 0, 100, 2) == 4 * sum(params[:3]) + 2 * 2 * 16 * 4 * 2 * 100 * 2
    assert stage_memory_bytes(shape, 3, 1, 100, 2) == 4 * sum(params[3:]) + 2 * 2 * 16 * 4 * 2 * 100 * 2
    opts = LMSweepOptions(model="tiny-lm", model_dir=None, splits="all", networks=["lan"], prompt_lens=[8],
                          memory_limits={"stage2": 100_000})
    from paretopipe.runners.lm_sweep import LMConfig

    assert "stage 2 needs 0.4 MB" in infeasible_why(opts, shape, LMConfig("lan", 8, "float32", 3))
    assert infeasible_why(opts, shape, LMConfig("lan", 8, "float32", 6)) is None  # stage 2 holds the head only


def test_the_bound_of_a_decode_step_adds_compute_round_trip_and_bytes():
    assert lm_fronts.decode_bound_s([0.001, 0.002], 1000, 0.02, 1e6) == 0.001 + 0.002 + 0.02 + 0.001
    assert lm_fronts.pareto_mask(__import__("numpy").array([[1, 2], [2, 1], [2, 2], [1, 2]])).tolist() == \
        [True, True, False, True]


def test_report_of_a_folder_follows_its_newest_session_of_either_kind(tmp_path):
    (tmp_path / "20261126-100000").mkdir()
    (tmp_path / "20261126-100000" / lm_fronts.SESSION_FILE).write_text("{}")
    assert lm_fronts.find_lm_session(tmp_path) == tmp_path / "20261126-100000"
    (tmp_path / "20261126-110000").mkdir()
    (tmp_path / "20261126-110000" / "session.json").write_text("{}")  # a newer image sweep
    assert lm_fronts.find_lm_session(tmp_path) is None
    assert lm_fronts.find_lm_session(tmp_path / "20261126-100000") == tmp_path / "20261126-100000"
