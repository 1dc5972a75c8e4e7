"""LoadGen driving a real two-stage TCP pipeline (both stages in this process over 127.0.0.1): the
logs kept beside the record and the record's figures equal to them, Offline's one query cut into
batches, accuracy mode against labels, the Server search finding a link's capacity, and the
open-ended schedule ending cleanly."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

import tcp_helpers
from conftest import ROOT
from paretopipe.errors import UsageError
from paretopipe.loadgen import logs, server_search
from paretopipe.loadgen.settings import LoadgenOptions
from paretopipe.network.conditions import Direction, NetworkConditions
from paretopipe.transport.inputs import SampleSet

pytest.importorskip("mlperf_loadgen")

MODEL = "mobilenetv2"
HELD = str(ROOT / "tests" / "loadgen" / "held_model.py") + ":build"


def _run(tmp, opts: LoadgenOptions, split: int = 8, model: str = MODEL, **kw):
    s1, s2 = tcp_helpers.run_in_threads(model, split, tmp, loadgen=opts, **kw)
    assert s1.record["status"] == "complete", s1.record["error"]
    return s1, s2


def _number(text: str, label: str) -> float:
    return float(re.search(re.escape(label) + r"\s*:\s*([0-9.]+)", text).group(1))


def test_singlestream_and_offline_keep_loadgens_logs_and_the_records_figures_agree_with_them(tmp_path):
    ss, s2 = _run(tmp_path / "ss", LoadgenOptions(scenario="singlestream", min_duration_s=1.0, min_query_count=64,
                                                  sample_count=8), batch_size=4, warmup=2)
    folder = ss.path.with_name(ss.path.stem + ".mlperf")
    rec = json.loads(ss.path.read_text())  # the record as written: the logs are files, named in it
    assert rec["loadgen"]["logs"] == {"folder": folder.name, "files": sorted(logs.KEPT)}
    summary, s = (folder / logs.SUMMARY).read_text(), rec["summary"]
    assert s["loadgen_latency_p90_s"] == pytest.approx(_number(summary, "90.0th percentile latency (ns)") / 1e9)
    assert s["loadgen_early_stopping_p90_s"] == pytest.approx(
        _number(summary, "Early stopping 90.0th percentile estimate") / 1e9)
    assert s["loadgen_result"] in ("VALID", "INVALID") and f"Result is : {s['loadgen_result']}" in summary
    assert (s["loadgen_scenario"], s["loadgen_compliance"]) == ("singlestream", "not MLPerf-compliant")
    # One batch per query of one sample, after the two warm-up batches; stage 2 served every one.
    measured = [b for b in rec["batches"] if not b["warmup"]]
    assert len(measured) == s["loadgen_queries"] >= 64 and {b["images"] for b in measured} == {1}
    assert s2.record["summary"]["batches_measured"] == len(measured)
    # LoadGen's latency of a query includes what the pipeline's batch latency does, and more.
    assert s["loadgen_latency_p50_s"] >= np.percentile([b["latency_s"] for b in measured], 50) * 0.95

    off, _ = _run(tmp_path / "off", LoadgenOptions(scenario="offline", min_duration_s=1.0, min_query_count=40,
                                                   sample_count=8), batch_size=4, in_flight=2, warmup=2)
    s = off.record["summary"]
    off_summary = (off.path.with_name(off.path.stem + ".mlperf") / logs.SUMMARY).read_text()
    assert s["loadgen_samples_per_s"] == pytest.approx(_number(off_summary, "Samples per second"), rel=1e-4)
    measured = [b for b in off.record["batches"] if not b["warmup"]]
    # Offline's one query, cut into batches of --batch-size (the last may be short).
    assert s["loadgen_queries"] == 1 and sum(b["images"] for b in measured) == s["loadgen_samples_per_query"] >= 40
    assert {b["images"] for b in measured[:-1]} == {4} and s["images_measured"] == s["loadgen_samples_per_query"]


def test_multistream_sends_each_query_as_one_batch_of_its_samples(tmp_path):
    ms, _ = _run(tmp_path, LoadgenOptions(scenario="multistream", min_duration_s=1.0, min_query_count=8,
                                          samples_per_query=3, sample_count=8), split=4, warmup=1)
    s, measured = ms.record["summary"], [b for b in ms.record["batches"] if not b["warmup"]]
    assert {b["images"] for b in measured} == {3} and len(measured) == s["loadgen_queries"] >= 8
    assert s["loadgen_samples_per_query"] == 3 and s["loadgen_latency_p99_s"] > 0


def _labelled_folder(tmp, builder, wrong: int) -> tuple:
    """Six images in class folders named by the unsplit model's own top-1 class, except image
    ``wrong``, filed under another class: a top-1 of 5/6 is what a split that computes exactly
    what the model computes must score."""
    from PIL import Image

    flat = tmp / "flat" / "x"
    flat.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(flat / f"{i}.png")
    samples = SampleSet(f"imagefolder:{tmp / 'flat'}", builder.input_size, 6)
    with torch.no_grad():
        top = [int(builder.model(samples.image(i)[None]).argmax()) for i in range(6)]
    root = tmp / "labelled"
    for i, cls in enumerate(top):
        label = (cls + 1) % 10 if i == wrong else cls
        (root / f"{label:04d}").mkdir(parents=True, exist_ok=True)
        shutil.copy(flat / f"{i}.png", root / f"{label:04d}" / f"{i}.png")
    return root, top


def test_accuracy_mode_scores_every_labelled_sample_once_through_the_split(tmp_path):
    builder = tcp_helpers.builder(MODEL)
    root, top = _labelled_folder(tmp_path, builder, wrong=2)
    acc, _ = _run(tmp_path / "run", LoadgenOptions(scenario="singlestream", mode="accuracy", min_duration_s=1.0,
                                                   sample_count=4), dataset=f"imagefolder:{root}", warmup=1)
    s = acc.record["summary"]
    assert (s["loadgen_accuracy_samples"], s["loadgen_accuracy_top1"]) == (6, pytest.approx(5 / 6))
    assert acc.record["loadgen"]["accuracy"]["top1_correct"] == 5
    # LoadGen's accuracy log holds each sample's response: the top-1 class the pipeline returned.
    folder = acc.path.with_name(acc.path.stem + ".mlperf")
    entries = json.loads((folder / logs.ACCURACY).read_text())
    got = sorted(int.from_bytes(bytes.fromhex(e["data"]), "little") for e in entries)
    assert len(entries) == 6 and got == sorted(top)


def test_a_failure_on_loadgens_thread_fails_the_run_instead_of_leaving_it_complete(tmp_path, monkeypatch):
    """LoadGen's thread ends the schedule when it fails; the source then raises what ended it, so
    the record is incomplete and names it (a run that stopped early is not reported complete
    without LoadGen's figures), and stage 2 hears at once that the run is over, not at its
    timeout (it would time out waiting for a frame instead). The failure is injected into LoadGen's test; the pipeline is real."""
    from paretopipe.errors import ParetoPipeError, PeerError
    from paretopipe.transport.sut.harness import Harness

    def failing_test(self, server_qps):
        raise ParetoPipeError("loadgen: injected failure of its test")

    monkeypatch.setattr(Harness, "_test", failing_test)
    with pytest.raises(PeerError, match="peer closed the connection"):
        tcp_helpers.run_in_threads(MODEL, 8, tmp_path, loadgen=LoadgenOptions(
            scenario="singlestream", min_duration_s=0.5, min_query_count=8, sample_count=8), batch_size=1, warmup=1)
    (path,) = (tmp_path / "s1").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "incomplete"
    assert "injected failure of its test" in record["error"], record["error"]


def test_accuracy_mode_refuses_unlabelled_inputs_in_one_line(tmp_path):
    with pytest.raises(UsageError, match="accuracy needs labelled inputs: give --dataset imagefolder:PATH"):
        tcp_helpers.run_in_threads(MODEL, 8, tmp_path, loadgen=LoadgenOptions(scenario="offline", mode="accuracy"))


@pytest.mark.slow  # 90 s of waiting on a shaped link: started first, not left for the pass's end
def test_the_server_search_finds_a_rate_within_ten_percent_of_the_links_capacity(tmp_path):
    """A link of 5 Mbit/s carries one 12 kB activation in about 20 ms: the pipeline's capacity is
    the link's, about 50 samples/s, while each stage holds a sample 4.5 ms (a scripted sleep, not
    this machine's compute). With a bound of 1 s on 12 s runs, the wait at the link breaks it only
    close to capacity, and above it the queue grows past the bound within the run."""
    rate_bps = 5e6
    link = NetworkConditions("slow", up=Direction(rate_bps=rate_bps), down=Direction())
    opts = LoadgenOptions(scenario="server", min_duration_s=12.0, min_query_count=16, sample_count=8,
                          latency_bound_s=1.0, server_steps=6)
    srv, _ = _run(tmp_path, opts, split=2, model=HELD, conditions=link, in_flight=8, warmup=4, batch_size=1)
    s, steps = srv.record["summary"], srv.record["loadgen"]["steps"]
    frame = s["wire_bytes_mean"]  # the activation and its frame's header, as the link serialises it
    capacity = rate_bps / 8 / frame
    assert 40 < capacity < 60
    assert abs(s["loadgen_server_qps"] - capacity) <= 0.1 * capacity, (capacity, steps)
    # The result is what the highest passing step completed, beside the rate it asked for.
    best = max((st for st in steps if st["passed"]), key=lambda st: st["target_qps"])
    assert (s["loadgen_server_qps"], s["loadgen_server_target_qps"]) == (best["loadgen_samples_per_s"],
                                                                         best["target_qps"])
    assert len(steps) >= 2 and any(not st["passed"] for st in steps)  # the bound was found, not assumed
    assert all(st["passed"] == (st["loadgen_latency_p99_s"] <= 1.0 and server_search.kept_up(st, 1.0)) for st in steps)
    folder = srv.path.with_name(srv.path.stem + ".mlperf")
    assert len(list((folder / "steps").iterdir())) == len(steps)


def test_loadgen_drives_stages_that_compute_under_onnx_runtime(tmp_path):
    pytest.importorskip("onnxruntime", reason="the engines extra (make installs it)")
    ss, s2 = _run(tmp_path / "ort", LoadgenOptions(scenario="singlestream", min_duration_s=0.5, min_query_count=24,
                                                   sample_count=8), batch_size=2, warmup=1, engine="onnxruntime")
    rec = json.loads(ss.path.read_text())
    assert rec["config"]["engine"] == "onnxruntime" and rec["summary"]["loadgen_queries"] >= 24
    for stage in (rec["manifest"]["stages"][0], s2.record["manifest"]["stages"][1]):
        assert stage["engine"]["engine"] == "onnxruntime" and stage["engine"]["max_rel_error"] < 1e-4
    # LoadGen's queries went through the exported stages: every measured batch answered, as under torch.
    measured = [b for b in rec["batches"] if not b["warmup"]]
    assert len(measured) == rec["summary"]["loadgen_queries"] == s2.record["summary"]["batches_measured"]
