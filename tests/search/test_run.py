"""``paretopipe search`` for real: each trial is a configuration the sweep measures into one
session (stage processes, the emulated link, summary.csv), the predicted front first, nothing
measured twice, and ``search.json`` agreeing with the session's own summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import PYTHON, ROOT
from paretopipe.errors import UsageError
from paretopipe.predict.device_profile import synthetic_profile
from paretopipe.search.run import predicted_first
from paretopipe.search.sweep_space import search_space
from paretopipe.controller.sweep import SweepOptions
import tcp_helpers as cli


def _profiles(tmp: Path) -> list[str]:
    """An edge device and a server shaped like MobileNetV2's 19 blocks (activations shrinking),
    the server ten times faster."""
    sizes = [int(6e5 * 0.75 ** i) for i in range(19)] + [4000]
    paths = []
    for name, speed in (("edge", 1.0), ("server", 0.1)):
        doc = synthetic_profile([speed * 2e-3] * 19, sizes, host=name).doc
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    return paths


def test_the_predicted_layers_are_configurations_of_the_space_each_networks_front_first(tmp_path):
    opts = SweepOptions(models=["mobilenetv2"], splits="0,6,12,19", networks=["lan", "lte"], batch_size=1)
    space = search_space(opts, 19, 2)
    everything = predicted_first(_profiles(tmp_path), opts, space, 2, budget=2 * space.size())
    # With a budget of twice the space, half of it is every configuration, ranked.
    assert len(everything) == space.size() == 8 and {c["network"] for c in everything} == {"lan", "lte"}
    assert all(c["split"] in (0, 6, 12, 19) for c in everything)
    # A budget of 4 measures each network's whole predicted front first, past half the budget if need be.
    front = predicted_first(_profiles(tmp_path), opts, space, 2, budget=4)
    assert list(everything[:len(front)]) == list(front) and {c["network"] for c in front} == {"lan", "lte"}
    assert 2 <= len(front) <= 4
    # Half of a budget of 12 is 6 configurations: the fronts, then the next layers.
    assert list(predicted_first(_profiles(tmp_path), opts, space, 2, budget=12)) == list(everything[:6])


def test_the_sweeps_search_flag_is_paretopipe_search_with_its_budget(tmp_path):
    """``automated_split_tester.py --search N`` is ``paretopipe search --budget N``: the same space,
    the same prediction, the same options."""
    profiles = ",".join(_profiles(tmp_path))
    common = ["--model", "mobilenetv2", "--splits", "0,6,12,19", "--network", "lan,lte", "--local", "--batch-size", "1",
              "--device-profiles", profiles, "--dry-run"]
    sweep = cli.run([PYTHON, "automated_split_tester.py", "--search", "5", *common], timeout=120)
    search = cli.run([PYTHON, "-m", "paretopipe", "search", "--budget", "5", *common], timeout=120)
    assert sweep.returncode == search.returncode == 0, sweep.stderr + search.stderr
    assert sweep.stdout == search.stdout
    assert sweep.stdout.startswith("search space: 8 configurations (split: 4, network: 2); budget 5;")


@pytest.mark.slow
def test_a_search_measures_its_budget_into_one_session_the_prediction_first(tmp_path):
    profiles = _profiles(tmp_path)
    opts = SweepOptions(models=["mobilenetv2"], splits="0,6,12,19", networks=["lan"], batch_size=1)
    budget = 3
    predicted = predicted_first(profiles, opts, search_space(opts, 19, 2), 2, budget)
    assert 1 <= len(predicted) < budget
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--budget", str(budget),
                    "--splits", "0,6,12,19", "--device-profiles", ",".join(profiles), "--network", "lan",
                    "--runs", "1", "--batch-size", "1", "--num-batches", "4", "--warmup", "1", "--threads", "1",
                    "--drift-every", "0", "--local", "--out", str(tmp_path / "out"), "--session", "s", "--no-report",
                    "--quiet"], cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "out" / "s"
    doc = json.loads((session / "search.json").read_text())
    trials = doc["trials"]
    assert doc["complete"] and doc["space_size"] == 4 and doc["predicted"] == len(predicted)
    assert doc["worker_groups_started"] == 1  # every trial ran on the first one's warm workers
    assert [t["config"]["split"] for t in trials[:len(predicted)]] == [c["split"] for c in predicted]
    assert [t["origin"] for t in trials[:len(predicted)]] == ["prediction"] * len(predicted)
    splits = [t["config"]["split"] for t in trials]
    assert len(trials) == budget and len(set(splits)) == budget  # each configuration measured once
    summary = pd.read_csv(session / "summary.csv").set_index("split_index")
    assert sorted(summary.index) == sorted(splits)
    for t in trials:  # what the search was told is what the session says
        row = summary.loc[t["config"]["split"]]
        assert t["status"] == "complete"
        assert t["values"] == pytest.approx([row["latency_median_s"], row["throughput_imgs_per_s"]])
    assert f"search: {budget} of 4 configurations measured ({len(predicted)} predicted" in proc.stdout
    assert "on the front" in proc.stdout


def test_the_closing_lines_give_a_front_per_network():
    """lte's best is slower than lan's worst: one front over both would hide lte's."""
    import types

    from paretopipe.search.run import describe
    from paretopipe.search.loop import SearchResult, Trial

    opts = SweepOptions(models=["mobilenetv2"], splits="0,6,12,19", networks=["lan", "lte"], batch_size=1)
    space = search_space(opts, 19, 2)
    trials = [Trial((6, "lan"), (0.03, 30.0), "sampler"), Trial((12, "lan"), (0.04, 25.0), "sampler"),
              Trial((6, "lte"), (0.13, 7.0), "sampler")]
    result = SearchResult(space, {"latency": "min", "throughput": "max"}, "tpe", trials, 3)
    lines = describe(result, types.SimpleNamespace(space=space, dir=Path("s"), study=None))
    assert [line for line in lines if "on the front" in line] == [
        "  on the front: {'split': 6, 'network': 'lan'} -> latency 0.03, throughput 30",
        "  on the front: {'split': 6, 'network': 'lte'} -> latency 0.13, throughput 7"]


@pytest.mark.slow
def test_a_search_may_vary_the_codec_and_the_batch_size_each_a_configuration_of_its_own(tmp_path):
    """--vary codec=... --vary batch_size=...: both are dimensions; configurations differing only in
    them get their own run files and summary rows, and each trial's objectives are its own."""
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--budget", "all", "--splits",
                    "0,19", "--vary", "codec=float32/none,float16/zstd", "--vary", "batch_size=1,2", "--runs", "1",
                    # 4 evaluation samples, not a lossy wire's 64: nothing here reads the fidelity figures
                    # (tests/transport/test_fidelity.py does), and the pass was half of this test's CPU.
                    "--num-batches", "3", "--warmup", "1", "--eval-samples", "4", "--drift-every", "0", "--local",
                    "--out", str(tmp_path),
                    "--session", "s", "--no-report"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "s" / "search.json").read_text())
    assert doc["space"] == {"split": [0, 19], "codec": ["float32/none", "float16/zstd"], "batch_size": [1, 2]}
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert len(summary) == 8 and len(summary.drop_duplicates(["split_index", "codec", "batch_size"])) == 8
    for t in doc["trials"]:
        c = t["config"]
        row = summary[(summary["split_index"] == c["split"]) & (summary["codec"] == c["codec"])
                      & (summary["batch_size"] == c["batch_size"])]
        assert t["values"][0] == pytest.approx(row["latency_median_s"].iloc[0])
    names = sorted(p.name for p in (tmp_path / "s" / "runs").glob("*.json"))
    # The first batch size and the default codec leave the names as a sweep's; the others name themselves.
    assert {"mobilenetv2_tcp_lan_k00_r0.json", "mobilenetv2_tcp_lan_k00_float16-zstd_r0.json",
            "mobilenetv2_tcp_lan_k00_b2_r0.json", "mobilenetv2_tcp_lan_k00_float16-zstd_b2_r0.json"} <= set(names)
    # k=0 ships the input: float16 halves what crosses the wire, and batch 2 doubles it.
    runs = pd.read_csv(tmp_path / "s" / "runs.csv").set_index(["split_index", "codec", "batch_size"])
    plain = runs.loc[(0, "float32/none", 1), "payload_bytes_mean"]
    assert runs.loc[(0, "float16/zstd", 1), "payload_bytes_mean"] == plain / 2
    assert runs.loc[(0, "float32/none", 2), "payload_bytes_mean"] == plain * 2


@pytest.mark.slow
def test_a_search_may_vary_the_engine_and_each_trial_is_measured_on_its_own(tmp_path):
    """--vary engine=torch,onnxruntime: the engine is a dimension as --engine's list is; each trial's
    configuration runs on its engine (its run files and summary rows say which)."""
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "examples/models/skipnet.py:build", "--budget",
                    "all", "--splits", "1,3", "--vary", "engine=torch,onnxruntime", "--batch-size", "2", "--runs", "1",
                    "--num-batches", "3", "--warmup", "1", "--drift-every", "0", "--local", "--out", str(tmp_path),
                    "--session", "s", "--no-report"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "s" / "search.json").read_text())
    assert doc["space"] == {"split": [1, 3], "engine": ["torch", "onnxruntime"]}
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert sorted(zip(summary["split_index"], summary["engine"])) == [(1, "onnxruntime"), (1, "torch"),
                                                                      (3, "onnxruntime"), (3, "torch")]
    for t in doc["trials"]:
        row = summary[(summary["split_index"] == t["config"]["split"]) & (summary["engine"] == t["config"]["engine"])]
        assert t["values"][0] == pytest.approx(row["latency_median_s"].iloc[0])
    assert (summary[summary.engine == "onnxruntime"]["engine_max_rel_error"] < 1e-4).all()


@pytest.mark.slow
def test_a_search_may_vary_the_in_flight_depth(tmp_path):
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--budget", "all", "--splits",
                    "0,19", "--vary", "in_flight=1,2", "--batch-size", "1", "--runs", "1", "--num-batches", "6",
                    "--warmup", "1", "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s"],
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert sorted(zip(summary["split_index"], summary["in_flight"])) == [(0, 1), (0, 2), (19, 1), (19, 2)]
    names = {p.name for p in (tmp_path / "s" / "runs").glob("*.json")}
    assert names == {"mobilenetv2_tcp_lan_k00_r0.json", "mobilenetv2_tcp_lan_k00_w2_r0.json",
                     "mobilenetv2_tcp_lan_k19_r0.json", "mobilenetv2_tcp_lan_k19_w2_r0.json"}
    for t in json.loads((tmp_path / "s" / "search.json").read_text())["trials"]:
        row = summary[(summary["split_index"] == t["config"]["split"]) & (summary["in_flight"] == t["config"]["in_flight"])]
        assert t["values"][1] == pytest.approx(row["throughput_imgs_per_s"].iloc[0])
    # The report keeps the depths apart, one panel each, named by depth.
    figures = {p.name for p in (tmp_path / "s" / "report").glob("front_*.png")}
    assert figures == {"front_mobilenet_v2_tcp_b1.png", "front_mobilenet_v2_tcp_b1_w2.png"}


@pytest.mark.slow
def test_two_workers_on_two_testbeds_share_one_study_and_report_merges_them(tmp_path):
    """Two ``paretopipe search --study journal:...`` processes, each its own testbed and session:
    the study's budget measured once in all, the reference configuration measured on both with
    the second's offset recorded, and ``report A B`` merging the testbeds."""
    common = [PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--splits", "0,6,12,19", "--network",
              "lan", "--runs", "1", "--batch-size", "1", "--num-batches", "4", "--warmup", "1", "--drift-every", "0",
              "--local", "--budget", "4", "--study", f"journal:{tmp_path / 'study.journal'}", "--out", str(tmp_path)]
    first = cli.popen(common + ["--testbed", "bench-a", "--session", "a"])
    time.sleep(3)   # bench-a makes the study; bench-b joins it
    second = cli.run(common + ["--testbed", "bench-b", "--session", "b"], timeout=600)
    out_a, err_a = first.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, err_a + second.stderr
    docs = {name: json.loads((tmp_path / name / "search.json").read_text()) for name in ("a", "b")}
    measured = [tuple(sorted(t["config"].items())) for d in docs.values() for t in d["trials"]
                if t["origin"] != "reference"]
    assert len(measured) == 4 and len(set(measured)) == 4          # the budget, in all, each once
    for name, d in docs.items():
        assert d["study"]["name"] == "paretopipe-mobilenet_v2" and d["testbed"] == f"bench-{name}"
        (ref,) = [t for t in d["trials"] if t["origin"] == "reference"]
        assert ref["config"] == {"split": 12} and ref["status"] == "complete"
    # The worker that finished last re-read the study at its end and saw both testbeds' references
    # (bench-a may finish first on a quiet machine: bench-b joined 3 s after it).
    final = max((d["reference"] for d in docs.values()), key=lambda r: len(r["testbeds"]))
    assert final["baseline"] == "bench-a" and set(final["testbeds"]) == {"bench-a", "bench-b"}
    lat_a, lat_b = final["testbeds"]["bench-a"][0], final["testbeds"]["bench-b"][0]
    assert final["offsets"]["bench-b"]["latency"] == pytest.approx(lat_b / lat_a, rel=1e-3)
    assert "4 configurations measured by all its workers" in out_a + second.stdout
    merged = cli.run([PYTHON, "-m", "paretopipe", "report", str(tmp_path / "a"), str(tmp_path / "b")], timeout=300)
    assert merged.returncode == 0, merged.stderr
    assert "split 12 (lan) measured on bench-a,bench-b: not judged: one run on bench-a, bench-b" in merged.stdout
    table = pd.read_csv(tmp_path / "a" / "report-testbeds" / "testbeds.csv")
    # Each session holds its trials and the reference (split 12, which one of them may also have had as a trial).
    per_session = sum(len({t["config"]["split"] for t in d["trials"]}) for d in docs.values())
    assert len(table) == per_session and table["on_front"].any()


@pytest.mark.slow
def test_a_sweep_shared_through_a_study_measures_its_whole_space_once_across_workers(tmp_path):
    """``automated_split_tester.py --study URL`` on two workers: every configuration of the sweep
    measured, each by one worker."""
    common = [PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "0,6,12,19", "--network",
              "lan", "--runs", "1", "--batch-size", "1", "--num-batches", "4", "--warmup", "1", "--drift-every", "0",
              "--local", "--study", f"journal:{tmp_path / 'sweep.journal'}", "--study-name", "shared-sweep",
              "--out", str(tmp_path), "--no-report"]
    first = cli.popen(common + ["--testbed", "one", "--session", "one"])
    time.sleep(3)
    second = cli.run(common + ["--testbed", "two", "--session", "two"], timeout=600)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, err + second.stderr
    trials = [t for name in ("one", "two") for t in json.loads((tmp_path / name / "search.json").read_text())["trials"]
              if t["origin"] != "reference"]
    assert sorted(t["config"]["split"] for t in trials) == [0, 6, 12, 19]   # the whole sweep, each once
    assert {t["testbed"] for t in trials} <= {"one", "two"}


@pytest.mark.slow
def test_a_search_may_vary_auto_as_a_codec_beside_named_dtypes(tmp_path):
    """--vary codec=int4/none,auto/none with --fidelity-target: auto is a configuration of its own,
    whose record names the dtype stage 1 chose to the target and its evidence."""
    base = [PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--budget", "all", "--splits", "14",
            "--vary", "codec=int4/none,auto/none", "--runs", "1", "--num-batches", "2", "--warmup", "1",
            "--eval-samples", "16", "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s",
            "--no-report"]
    refused = cli.run(base, timeout=300)
    assert refused.returncode == 2 and "give --fidelity-target" in refused.stderr
    proc = cli.run([*base, "--fidelity-target", "0.9"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert sorted(summary["codec"]) == ["auto/none", "int4/none"]
    auto = json.loads((tmp_path / "s" / "runs" / "mobilenetv2_tcp_lan_k14_auto-none_r0.json").read_text())
    choice = auto["config"]["wire_choice"]
    assert choice["target"] == 0.9 and auto["config"]["wire_dtype"] == choice["chosen"]
    assert list(choice["tried"])[0] == "int4"  # the fewest bytes tried first


def _lm_profiles(tmp: Path) -> list[str]:
    """tiny-lm's device profiles: an edge device ten times slower than a server, each block's
    prefill of 8 and 32 tokens and its decode step."""
    from paretopipe.llm import shapes
    from paretopipe.predict.lm_costmodel import PROFILE_KIND

    shape = shapes.shape_of("tiny-lm")
    paths = []
    for name, speed in (("edge", 10.0), ("server", 1.0)):
        phases = {str(p): {"prefill_s": [speed * 1e-5 * p] * shape.num_blocks,
                           "decode_s": [speed * 2e-5] * shape.num_blocks} for p in (8, 32)}
        path = tmp / f"lm-{name}.json"
        path.write_text(json.dumps({"kind": PROFILE_KIND, "model": shape.name, "blocks": shapes.block_names(shape),
                                    "prompt_lens": phases}))
        paths.append(str(path))
    return paths


def test_a_language_models_predicted_layers_cover_its_splits_prompts_and_dtypes(tmp_path):
    from paretopipe.search.run import predicted_first_generation

    opts = SweepOptions(models=["tiny-lm"], splits="all", networks=["lan", "3g"], prompt_lens=[8, 32])
    assert opts.workload.generates
    space = search_space(opts, 6, 2, {"codec": ("float32/none", "int8/none")})
    assert space.names == ["split", "network", "prompt_len", "codec"] and space.size() == 7 * 2 * 2 * 2
    everything = predicted_first_generation(_lm_profiles(tmp_path), opts, space, budget=2 * space.size())
    assert len(everything) == space.size() and {tuple(sorted(c)) for c in everything} == {
        ("codec", "network", "prompt_len", "split")}
    # On 3g the server's blocks are cheap and the link dear: the split that sends token ids (8 B a
    # token) leads the first layer of both prompt lengths; int8 halves what a hidden state costs.
    first_3g = [c for c in everything if c["network"] == "3g"][:2]
    assert {(c["split"], c["codec"]) for c in first_3g} <= {(0, "float32/none"), (0, "int8/none")}
    with pytest.raises(UsageError, match="a language model's prediction is of two devices"):
        predicted_first_generation(_lm_profiles(tmp_path)[:1], opts, space, budget=4)
    with pytest.raises(UsageError, match="--vary batch_size: a language model's steps are one token of each stream"):
        search_space(opts, 6, 2, {"batch_size": (1, 2)})
    with pytest.raises(UsageError, match="--vary streams: streams are a language model's"):
        search_space(SweepOptions(models=["mobilenetv2"], splits="all"), 19, 2, {"streams": (1, 2)})


@pytest.mark.slow
def test_a_language_models_search_may_vary_its_streams(tmp_path):
    """--vary streams=1,2: a generation's window is a dimension, each number of streams a
    configuration of its own (the key's in_flight; run files name all but the first, _w2), measured
    on the same warm workers, and each trial told its own configuration's figures."""
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "tiny-lm", "--splits", "0,3", "--budget", "all",
                    "--prompt-len", "8", "--gen-tokens", "4", "--vary", "streams=1,2", "--runs", "1",
                    "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s", "--no-report"],
                   timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert sorted(zip(summary["split_index"], summary["in_flight"])) == [(0, 1), (0, 2), (3, 1), (3, 2)]
    names = {p.name for p in (tmp_path / "s" / "runs").glob("*.json")}
    assert names == {"tiny-lm_tcp_lan_k00_p8_r0.json", "tiny-lm_tcp_lan_k00_w2_p8_r0.json",
                     "tiny-lm_tcp_lan_k03_p8_r0.json", "tiny-lm_tcp_lan_k03_w2_p8_r0.json"}
    doc = json.loads((tmp_path / "s" / "search.json").read_text())
    assert doc["worker_groups_started"] == 1 and len(doc["trials"]) == 4
    for t in doc["trials"]:
        c = t["config"]
        row = summary[(summary["split_index"] == c["split"]) & (summary["in_flight"] == c["streams"])]
        assert len(row) == 1 and t["values"] == pytest.approx([row["ttft_median_s"].iloc[0],
                                                               row["tpot_median_s"].iloc[0]])
    for name in names:  # each run generated as many streams as its configuration says
        rec = json.loads((tmp_path / "s" / "runs" / name).read_text())
        assert rec["config"]["generation"]["streams"] == (2 if "_w2_" in name else 1)


@pytest.mark.slow
def test_a_language_models_search_measures_its_prediction_first_on_warm_workers(tmp_path):
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "tiny-lm", "--splits", "all", "--budget", "6",
                    "--network", "lan,3g", "--prompt-len", "8,32", "--gen-tokens", "4", "--vary",
                    "codec=float32/none,int8/none", "--device-profiles", ",".join(_lm_profiles(tmp_path)),
                    "--runs", "1", "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s",
                    "--no-report"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "s" / "search.json").read_text())
    assert doc["objectives"] == ["ttft", "tpot"] and doc["space_size"] == 56 and len(doc["trials"]) == 6
    predicted = doc["predicted"]  # each network's and prompt length's front, then half the budget at most
    assert 3 <= predicted <= 6 and [t["origin"] for t in doc["trials"][:predicted]] == ["prediction"] * predicted
    assert doc["worker_groups_started"] == 1  # a prompt length, a network, a dtype: the same warm workers
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    for t in doc["trials"]:  # what the search was told is the session's own summary
        c = t["config"]
        row = summary[(summary["split_index"] == c["split"]) & (summary["network"] == c["network"])
                      & (summary["prompt_len"] == c["prompt_len"]) & (summary["codec"] == c["codec"])]
        assert len(row) == 1 and t["values"] == pytest.approx([row["ttft_median_s"].iloc[0],
                                                               row["tpot_median_s"].iloc[0]])
    assert f"search: 6 of 56 configurations measured ({predicted} predicted" in proc.stdout


@pytest.mark.slow
def test_a_search_under_a_loadgen_scenario_takes_loadgens_figures_as_its_objectives(tmp_path):
    proc = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "tiny-lm", "--splits", "0,3,6", "--budget", "2",
                    "--gen-tokens", "4", "--prompt-len", "8", "--scenario", "singlestream", "--objectives",
                    "loadgen_ttft_p90,loadgen_tpot_p90", "--min-duration-s", "1", "--min-query-count", "8",
                    "--runs", "1", "--drift-every", "0", "--local", "--out", str(tmp_path), "--session", "s",
                    "--no-report"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "s" / "search.json").read_text())
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert doc["objectives"] == ["loadgen_ttft_p90", "loadgen_tpot_p90"] and len(doc["trials"]) == 2
    for t in doc["trials"]:
        row = summary[summary["split_index"] == t["config"]["split"]]
        assert (row["scenario"] == "singlestream").all()
        assert t["values"] == pytest.approx([row["loadgen_ttft_p90_s"].iloc[0], row["loadgen_tpot_p90_s"].iloc[0]])
    several = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "tiny-lm", "--budget", "2", "--scenario",
                       "closed,offline", "--dry-run", "--local"], timeout=120)
    assert several.returncode == 2 and "a search measures under one load" in several.stderr
