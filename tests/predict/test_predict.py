"""Real profiles, predictions through the command line, and validation against a real sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from paretopipe.partition import tables

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m"]


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    from tcp_helpers import run

    return run([*CLI, *args], timeout=timeout)


def _profile(path: Path, codecs: str = "float32/none", cpus: str = "0") -> str:
    """Profile MobileNetV2 on one core with one thread, as the sweeper runs a stage; returns stdout."""
    proc = _run("paretopipe.profile", "--model", "mobilenetv2", "--threads", "1", "--cpus", cpus, "--repetitions", "9",
                "--codecs", codecs, "--out", str(path), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="session")
def mobilenet_profile(tmp_path_factory, worker_id) -> Path:
    """A real profile of MobileNetV2 on core 0 with one thread, as the sweeper runs a stage; made
    once per test run (its tests land on different xdist workers, which share the temp root)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    path = (base.parent if worker_id != "master" else base) / "cpu-mobilenet_v2.json"
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            made = path.with_suffix(".new.json")
            assert "segments sum to" in _profile(made, "float32/none,float16/none")
            made.rename(path)
    return path


@pytest.mark.slow
def test_profile_has_one_segment_per_fine_cut_that_add_up(mobilenet_profile):
    doc = json.loads(mobilenet_profile.read_text())
    _, part = tables.partitioner_for("mobilenetv2")
    assert [b["name"] for b in doc["boundaries"]] == ["input"] + [c.name for c in part.cuts] + ["output"]
    assert len(doc["segments"]) == len(part.cuts) + 1  # one ending at each fine cut, one at the output
    assert [b["bytes_per_image"] for b in doc["boundaries"][1:-1]] == [c.nbytes for c in part.cuts]
    assert doc["boundaries"][0]["bytes_per_image"] == 3 * 224 * 224 * 4
    # FLOPs count grouped convolutions per group: MobileNetV2 is ~0.3 GMACs = ~0.6 GFLOPs, where a
    # dense count of its depthwise convolutions (the anchor's mistake) would be several times more.
    total = sum(s["flops_per_image"] for s in doc["segments"])
    assert total == doc["total_flops_per_image"] and 0.5e9 < total < 0.7e9
    per = doc["by_batch"]["1"]
    assert len(per["segment_compute_s"]) == len(doc["segments"]) and min(per["segment_compute_s"]) >= 0
    # How closely the segments sum to the whole model is this machine's noise, printed by
    # benchmarks/prediction_accuracy.py; every segment and the whole model are timed.
    assert per["whole_model_s"] > 0
    assert set(per["codecs"]) == {"float32/none", "float16/none"}
    half, full = per["codecs"]["float16/none"][1], per["codecs"]["float32/none"][1]
    assert half["wire_bytes"] * 2 == full["wire_bytes"] == doc["boundaries"][1]["bytes_per_image"]
    manifest = doc["manifest"]
    assert manifest["torch_threads"] == 1 and manifest["limits"]["cpu_affinity"] == [0]
    assert manifest["cpu_model"] and manifest["torch"]
    assert {str(k) for k in range(part.num_blocks + 1)} == set(doc["blocks"])


def test_predict_cli_table_front_and_rate_map(mobilenet_profile, tmp_path):
    p = str(mobilenet_profile)
    proc = _run("paretopipe.predict", "--model", "mobilenetv2", "--device-profiles", f"{p},{p}",
                "--network", "lan,lte", "--out", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "predictions.csv")
    lte = table[table.network == "lte"].set_index("split")
    assert len(lte) == 20 and lte["on_front"].any()
    # Under LTE (12 Mbit/s) shipping the 602 KB input costs > 0.4 s; the logits cost nothing.
    assert lte.loc[0, "predicted_latency_s"] > 0.4 > lte.loc[19, "predicted_latency_s"]
    assert lte.loc[0, "predicted_bottleneck"] == "link1"
    assert "network lte" in proc.stdout and "* = on the predicted front" in proc.stdout

    proc = _run("paretopipe.predict", "--model", "mobilenetv2", "--stage-profiles", f"{p},{p}",
                "--sweep-rate", "1mbit..10gbit", "--delay", "5ms", "--sweep-points", "30", "--out", str(tmp_path),
                "--quiet")
    assert proc.returncode == 0, proc.stderr
    rates = pd.read_csv(tmp_path / "optimal_split_vs_rate.csv")
    assert len(rates) == 30 and (tmp_path / "optimal_split_vs_rate.png").stat().st_size > 10_000
    # With equal devices, a slow link favours keeping everything local; a fast one lets the split
    # balance the two devices for throughput.
    assert str(rates["best_latency_split"].iloc[0]) == "19"
    assert rates["best_throughput_split"].iloc[-1] != rates["best_throughput_split"].iloc[0]
    assert "throughput-optimal split by link rate:" in proc.stdout


def test_three_device_plans_are_valid_split_blocks(mobilenet_profile):
    p = str(mobilenet_profile)
    proc = _run("paretopipe.predict", "--model", "mobilenetv2", "--stage-profiles", f"{p},{p},{p}",
                "--links", "wifi,lan", "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and line.split()[0][0].isdigit()]
    assert rows
    for blocks, *_ in rows:
        ks = [int(k) for k in blocks.split(",")]
        assert len(ks) == 2 and ks == sorted(ks) and 0 <= ks[0] and ks[1] <= 19
    assert "--split-blocks <list>" in proc.stdout


@pytest.mark.parametrize("problem, args, message", [
    ("another model", ["--model", "resnet18"], "profiles mobilenet_v2, not resnet18"),
    ("missing file", ["--device-profiles", "nowhere.json,nowhere.json"], "device profile not found: nowhere.json"),
    ("one device", ["--device-profiles", "PROFILE"], "needs at least 2 device profiles"),
    ("bad range", ["--sweep-rate", "1gbit..1mbit"], "from a lower to a higher"),
    ("unknown link", ["--network", "moon"], "unknown network 'moon'"),
    ("missing batch", ["--batch-size", "8"], "no timings at batch size 8"),
    ("missing codec", ["--compression", "zstd"], "no float32/zstd codec timings"),
])
def test_bad_input_is_one_clear_line(mobilenet_profile, problem, args, message):
    p = str(mobilenet_profile)
    base = {"--model": "mobilenetv2", "--device-profiles": f"{p},{p}"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value.replace("PROFILE", p)
    proc = _run("paretopipe.predict", *[x for kv in base.items() for x in kv])
    assert proc.returncode == 2, (problem, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (problem, proc.stderr)


def test_a_profile_with_live_sets_times_them_and_predict_weighs_their_bytes(tmp_path):
    from paretopipe.partition import tables as splitting
    from paretopipe.transport import wire

    out = tmp_path / "r18.json"
    proc = _run("paretopipe.profile", "--model", "resnet18", "--threads", "1", "--max-live", "2", "--repetitions", "2",
                "--warmup", "1", "--codecs", "float32/none", "--ciphers", "chacha20", "--batch-sizes", "1",
                "--dataset", "synthetic", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-1500:]
    doc = json.loads(out.read_text())
    _, part = splitting.partitioner_for("resnet18", batch=1, structure_only=True)
    names = [b["name"] for b in doc["boundaries"]]
    assert names == ["input"] + [c.name for c in part.fine_cuts] + ["output"]  # every cut of 1 or 2 tensors
    assert doc["method"]["max_live"] == 2 and len(doc["by_batch"]["1"]["segment_compute_s"]) == len(names) - 1
    frames = doc["by_batch"]["1"]["codecs"]["float32/none"]
    for i, b in enumerate(doc["boundaries"]):
        cut = part.cut(b["name"]) if b["name"] not in ("input", "output") else None
        if cut is not None and cut.width == 2:
            assert b["live"] == 2 and b["bytes_per_image"] == cut.nbytes
            # One frame carries the live set: the header, one descriptor and both tensors.
            assert frames[i]["frame_bytes"] == wire.HEADER.size + wire.DESCRIPTOR.size + cut.nbytes
    table = _run("paretopipe.predict", "--model", "resnet18", "--device-profiles", f"{out},{out}", "--network", "lan",
                 "--fine")
    assert table.returncode == 0, table.stderr
    assert "maxpool+layer1_0_relu" in table.stdout


def _engine_profile(engine: str, segments: list[float], range_s: dict[str, float] | None = None):
    from paretopipe.predict.device_profile import synthetic_profile

    p = synthetic_profile(segments, [600_000, 400_000, 200_000, 40], host=engine)
    p.doc["engine"] = {"engine": engine, "version": "x"}
    if range_s:
        p.doc["by_batch"]["1"]["range_compute_s"] = range_s
    return p


def test_a_profile_per_engine_prices_each_engine_and_one_front_says_which_wins(tmp_path):
    """Two sets of profiles, eager torch and ONNX Runtime (whose stage times come from the ranges
    it timed as one export each): one front per network over both engines, and the CLI's lines."""
    from paretopipe.errors import UsageError
    from paretopipe.network.conditions import get_conditions
    from paretopipe.predict.costmodel import LinkModel
    from paretopipe.predict.predictions import engines_front

    slow = _engine_profile("torch", [0.03, 0.03, 0.03])
    fast = _engine_profile("onnxruntime", [0.03, 0.03, 0.03], {"0:1": 0.004, "1:3": 0.008, "0:2": 0.007, "2:3": 0.004})
    assert fast.stage_compute_s(1, 0, 2) == 0.007 and slow.stage_compute_s(1, 0, 2) == pytest.approx(0.06)
    up, down = LinkModel.pair(get_conditions("wifi"))
    table = engines_front([[slow, slow], [fast, fast]], up, 1, "float32/none", down)
    assert set(table["engine"]) == {"torch", "onnxruntime"}
    assert set(table.loc[table["on_front"], "engine"]) == {"onnxruntime"}  # faster at every split
    with pytest.raises(UsageError, match="give one set per engine"):
        engines_front([[slow, slow], [slow, slow]], up, 1, "float32/none", down)
    paths = []
    for name, p in (("torch", slow), ("ort", fast)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(p.doc))
        paths.append(str(path))
    from paretopipe.cli.predict import main

    assert main(["--model", "mobilenet_v2", "--device-profiles", f"{paths[0]},{paths[0]};{paths[1]},{paths[1]}",
                 "--network", "wifi,lte", "--out", str(tmp_path / "out")]) == 0
    written = pd.read_csv(tmp_path / "out" / "predictions.csv")
    assert set(written["network"]) == {"wifi", "lte"} and set(written["engine"]) == {"torch", "onnxruntime"}
