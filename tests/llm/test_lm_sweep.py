"""A language model on the one sweeper: real stage workers, every configuration's record and
summary row with its token figures, prompt lengths as passes of one group, the fronts of time to
first token against time per token, and ``report`` reading the session back as any other."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import PYTHON, cgroups_missing
from paretopipe import faults
from paretopipe.llm import shapes
from paretopipe.llm.builder import LMBuilder
from paretopipe.llm.summary import decode_bound_s
from paretopipe.transport.runconfig import Generation, RunConfig
from tcp_helpers import run


def _rows(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One language model's sweep: two networks, two prompt lengths, three splits."""
    tmp = tmp_path_factory.mktemp("lm-sweep")
    nets = tmp / "nets.toml"
    nets.write_text('[lan]\n[slow]\ndelay = "10ms"\nrate = "2mbit"\n')
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "0,3,6", "--network",
               "lan,slow", "--network-file", str(nets), "--prompt-len", "8,32", "--gen-tokens", "4", "--runs", "1",
               "--out", str(tmp / "res"), "--session", "s"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "res" / "s", res


def test_a_sweep_measures_every_configuration_and_reports_its_fronts(swept):
    session, res = swept
    rows = _rows(session / "summary.csv")
    assert len(rows) == 2 * 2 * 3 and all(r["status"] == "complete" for r in rows)
    assert sorted({(r["network"], r["prompt_len"]) for r in rows}) == [("lan", "32"), ("lan", "8"), ("slow", "32"),
                                                                       ("slow", "8")]
    records = sorted((session / "runs").glob("*.json"))
    assert len(records) == 12 and all("_p8_" in p.name or "_p32_" in p.name for p in records)
    for path in records:
        rec = json.loads(path.read_text())
        assert rec["status"] == "complete" and [len(t) for t in rec["generation"]["tokens"]] == [4]
    # A stage process holds one plan's blocks at a time: a run whose group ran another plan just
    # before builds its blocks again, so it warms up first (its TTFT would pay for the build).
    measured = [*records, *(session / "reference").glob("*.json")]  # the drift check's runs use the stages too
    ordered = sorted((json.loads(p.read_text()) for p in measured), key=lambda r: r["created_utc"])
    for before, rec in zip(ordered, ordered[1:]):
        same_plan = before["config"]["cuts"] == rec["config"]["cuts"]
        assert (rec["config"]["generation"]["warmup_streams"] == 0) == same_plan, rec["config"]["run_key"]
    runs = _rows(session / "runs.csv")
    assert {"ttft_median_s", "tpot_median_s", "tokens_per_s", "prompt_len"} <= set(runs[0])
    assert {r["workload"] for r in runs} == {r["workload"] for r in rows} == {"generation"}  # the rows say it
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
    assert "within 95% CIs (time to first token and per token: medians, s; throughput in tokens/s):" in res.stdout
    again = run([PYTHON, "-m", "paretopipe", "report", str(session)], timeout=120)
    assert again.returncode == 0 and "ttft_median_s" in again.stdout and "prompt_len" in again.stdout


def test_its_session_is_read_as_any_other_by_report_html_watch_and_compare(swept, tmp_path):
    from paretopipe.analysis.compare import compare
    from paretopipe.analysis.live_state import LiveSession

    session, _ = swept
    page = (session / "report" / "report.html").read_text()
    assert "time to first token" in page and "tokens_memory" not in page
    state = LiveSession(session).state()
    assert state["axes"]["x"]["column"] == "ttft_median_s" and len(state["configurations"]) == 12
    assert any(c["on_front"] for c in state["configurations"])
    result = compare(session, session, out=tmp_path / "cmp")
    assert set(result["points"]["ttft_median_s_change"]) == {0.0} and set(result["fronts"]["jaccard"]) == {1.0}
    assert any(p.name.startswith("compare_tiny-lm_tcp_p8") for p in result["files"])


@pytest.mark.slow
def test_the_notebook_draws_a_language_models_fronts(swept):
    import nbformat

    from conftest import ROOT
    from notebook_helpers import execute

    session, _ = swept
    nb = nbformat.read(ROOT / "notebooks" / "pareto_front.ipynb", as_version=4)
    out = execute(nb, {"PARETOPIPE_RESULTS_DIR": str(session), "MPLBACKEND": "Agg"})
    assert "ttft_median_s" in out and "objectives this session has: ttft, tpot" in out


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
    (["--scenario", "multistream"], "a language model's queries are prompts, one a query"),
    (["--models", "tiny-lm,mobilenetv2"], "sweep each kind in a session of its own"),
    (["--search", "4", "--vary", "batch_size=1,2"], "--vary batch_size: a language model's steps are one token of each"),
])
def test_what_a_language_model_cannot_take_is_one_line(tmp_path, args, needle):
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--out", str(tmp_path), *args], timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def _unsplit_tokens_of(record: dict) -> list[list[int]]:
    """The unsplit model's tokens for the prompts a run's configuration names (its seed is its run)."""
    from paretopipe.llm import generate

    builder = LMBuilder(record["config"]["model"])
    g = Generation(**record["config"]["generation"])
    model = generate.reference_model(builder.src)
    return [generate.generate_unsplit(model, p, g.gen_tokens)[0] for p in builder.prompts(g, record["config"]["seed"])]


@pytest.mark.slow
def test_three_stage_plans_on_both_backends_generate_the_unsplit_models_tokens(tmp_path):
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--split-blocks", "1,4;2,5", "--backend",
               "both", "--network", "lan", "--prompt-len", "12", "--gen-tokens", "6", "--runs", "1", "--streams", "2",
               "--out", str(tmp_path), "--session", "s", "--no-report"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "s" / "runs").glob("*.json"))]
    assert sorted((r["backend"], r["config"]["split_index"]) for r in records) == [
        ("rpc", [1, 4]), ("rpc", [2, 5]), ("tcp", [1, 4]), ("tcp", [2, 5])]
    for record in records:
        assert record["status"] == "complete" and len(record["generation"]["stages"]) == 3
        assert record["generation"]["tokens"] == _unsplit_tokens_of(record)


@pytest.mark.root
@pytest.mark.skipif(cgroups_missing() is not None, reason=f"no usable cgroup cpu controller: {cgroups_missing()}")
def test_an_emulated_edge_device_measured_to_a_precision_keeps_the_unsplit_models_tokens(tmp_path):
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "0,3,6", "--network", "lan",
               "--prompt-len", "12", "--gen-tokens", "6", "--runs", "2", "--precision", "10%", "--max-runs", "3",
               "--stage-cpu", "0.5,1", "--out", str(tmp_path), "--session", "s", "--no-report"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    session = tmp_path / "s"
    records = [json.loads(p.read_text()) for p in sorted((session / "runs").glob("*.json"))]
    assert 6 <= len(records) <= 9 and all(r["status"] == "complete" for r in records)
    assert {r["config"]["stage_limits"]["stage1"]["cpu_share"] for r in records} == {0.5}
    for record in records:
        assert record["generation"]["tokens"] == _unsplit_tokens_of(record)
    rows = _rows(session / "summary.csv")
    assert {r["stop_reason"] for r in rows} <= {"precise", "budget"} and all(int(r["runs"]) >= 2 for r in rows)


@pytest.mark.slow
def test_a_generation_lives_through_stage_2_killed_frozen_and_the_link_down_with_the_unsplit_models_tokens(tmp_path):
    """The faults' treatment on a language model: a step whose token does not come by the deadline
    is finished on stage 1 (its own rest of the model, its cache rebuilt from the stream's tensors
    at the cut); a stage 2 started again after the kill is sent the stream's positions so far and
    generates the rest. Every step is served exactly once, and the tokens are the unsplit model's."""
    res = run([PYTHON, "automated_split_tester.py", "--model", "tiny-lm", "--splits", "2", "--network", "lan",
               "--fault", "none,stage2:kill@5+0.2,stage2:freeze@5+1,link:down@5+1", "--deadline-ms", "600",
               "--prompt-len", "8", "--gen-tokens", "450", "--runs", "1", "--out", str(tmp_path), "--session", "s",
               "--no-report", "--quiet"], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    records = {r["config"]["fault"] and faults.Fault(**r["config"]["fault"]).kind or "none": r
               for r in (json.loads(p.read_text()) for p in sorted((tmp_path / "s" / "runs").glob("*.json")))}
    assert set(records) == {"none", "kill", "freeze", "down"}
    unsplit = _unsplit_tokens_of(records["none"])
    for kind, record in records.items():
        assert record["status"] == "complete" and record["generation"]["tokens"] == unsplit, kind
        steps = [b for b in record["batches"] if not b.get("warmup")]
        assert len(steps) == 450 and [b["step"] for b in steps] == list(range(450))
        if kind == "none":
            continue
        s = record["summary"]
        assert s["fault_lost"] == 0 and s["fault_duplicated"] == 0 and s["fault_served_locally"] >= 1, kind
        assert s["fault_recover_s"] is not None, kind  # stage 2 served steps again before the run ended
    events = [e["event"] for e in records["kill"]["manifest"]["stages"][0]["fallback"]["events"]]
    assert events[:2] == ["fault", "peer_lost"] and "reconnected" in events
    # After the reconnection the new stage 2 served the steps, its cache caught up by the catch-up step.
    kill_steps = [b for b in records["kill"]["batches"] if not b.get("warmup")]
    assert not kill_steps[-1].get("served_locally") and any(b.get("served_locally") for b in kill_steps)
