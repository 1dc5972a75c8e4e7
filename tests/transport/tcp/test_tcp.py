"""TCP backend end to end on 127.0.0.1: exact outputs, honest records, and robust failure handling."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time

import jsonschema
import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe import records
from paretopipe.network.conditions import get_conditions
from paretopipe.transport import inputs as data
from tcp_helpers import builder, free_port, kill_group, run, run_in_threads, start, wait_for_line


def _reference(name, batch, count, seed=0, dataset="synthetic"):
    from paretopipe.partition import models

    model = builder(name).model
    size = models.input_size(name)
    with torch.no_grad():
        return [model(x) for x in data.batches(dataset, batch, size, count, seed=seed)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenetv2", "resnet50"])
def test_outputs_equal_unsplit_model_at_splits_and_baselines(name, tmp_path):
    K = builder(name).partitioner.num_blocks
    ref = _reference(name, 2, 3)
    schema = records.load_schema()
    for k in (0, 1, K // 2, K - 1, K):
        s1, s2 = run_in_threads(name, k, tmp_path / str(k), batch_size=2, num_batches=2, warmup=1, in_flight=2)
        assert len(s1.outputs) == 3
        for got, want in zip(s1.outputs, ref):
            assert torch.allclose(got, want, atol=1e-5, rtol=0), f"{name} k={k}"
        for outcome in (s1, s2):
            jsonschema.validate(outcome.record, schema)
            assert outcome.record["status"] == "complete"
        written = json.loads(s2.path.read_text())
        assert written["run_id"] == s1.record["run_id"]
        assert written["summary"]["batches_measured"] == 2
        assert written["config"]["split_index"] == k
        assert {m["role"] for m in written["manifest"]["stages"]} == {"stage1", "stage2"}


def test_record_numbers_are_consistent_and_measured(tmp_path):
    conditions = get_conditions("wifi")
    s1, _ = run_in_threads("mobilenetv2", 8, tmp_path, conditions=conditions, batch_size=2, num_batches=6,
                           warmup=2, in_flight=1)
    rec = s1.record
    summ = rec["summary"]
    measured = [b for b in rec["batches"] if not b["warmup"]]
    assert len(measured) == 6 and summ["images_measured"] == 12
    for b in measured:
        parts = sum(b[k] for k in records.WORK_FIELDS)
        assert 0 < parts < b["latency_s"]
        assert b["payload_bytes"] == builder("mobilenetv2").partitioner.payload_nbytes(s1.record["config"]["cuts"][0], 2)
    # The emulated wifi link: payload at 50 Mbit/s plus 3 ms each way is the floor of transfer.
    floor = summ["payload_bytes_mean"] * 8 / 50e6 + 2 * 0.003 - 3 * 0.001 * 2
    assert summ["transfer_median_s"] > floor
    assert rec["manifest"]["link"]["mode"] == "emulated"
    assert rec["manifest"]["link"]["conditions"]["up"]["rate_mbit_per_s"] == 50
    # Throughput from the steady-state window (first completion to last), not from latency.
    ends = sorted(b["end_s"] for b in measured)
    window = summ["measured_window_s"]
    assert window == pytest.approx(ends[-1] - ends[0])
    assert summ["throughput_imgs_per_s"] == pytest.approx((12 - 2) / window)


def test_the_window_overlaps_batches_only_when_it_allows_them_in_flight(tmp_path):
    """With a 20 ms link delay a batch's result needs at least 40 ms after it is sent, while the
    source starts its next batch as soon as it has sent one, so with --in-flight 4 batch i+1 starts
    before batch i ends; with 1 it never does. How much throughput that gains is a measurement
    (benchmarks/pipelining.py), not this test's business."""
    conditions = get_conditions(None, rate="20mbit", delay="20ms")
    seq, _ = run_in_threads("mobilenetv2", 8, tmp_path / "a", conditions=conditions, batch_size=1,
                            num_batches=8, warmup=1, in_flight=1)
    pipe, _ = run_in_threads("mobilenetv2", 8, tmp_path / "b", conditions=conditions, batch_size=1,
                             num_batches=8, warmup=1, in_flight=4)

    def overlaps(record):
        b = record["batches"]
        return [nxt["start_s"] < cur["end_s"] for cur, nxt in zip(b, b[1:])]

    assert not any(overlaps(seq.record))
    assert all(overlaps(pipe.record))


@pytest.mark.slow
def test_cli_end_to_end_with_compression_and_saved_outputs(tmp_path):
    port = str(free_port())
    out = tmp_path / "out.npz"
    common = ["--model-name", "resnet18", "--split-index", "3", "--port", port, "--batch-size", "2", "--threads", "1",
              "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--num-batches", "2", "--warmup", "1",
               "--compression", "zstd", "--save-outputs", str(out))
    s2 = start("partition2.py", *common, "--output-dir", str(tmp_path))
    assert s2.wait(120) == 0, s2.stderr.read()
    assert s1.wait(60) == 0, s1.stderr.read()
    logits = np.load(out, allow_pickle=False)["logits"]
    ref = _reference("resnet18", 2, 3, dataset="photos")  # compression defaults to real photographs
    assert np.allclose(logits, torch.stack(ref).numpy(), atol=1e-5)
    (path,) = tmp_path.glob("resnet18-*.json")
    rec = json.loads(path.read_text())
    assert rec["config"]["compression"] == "zstd"
    assert rec["summary"]["wire_bytes_mean"] != rec["summary"]["payload_bytes_mean"]


@pytest.mark.slow
def test_handshake_mismatch_fails_clearly_and_stranger_does_not_kill_listener(tmp_path):
    port = free_port()
    common = ["--model-name", "resnet18", "--port", str(port), "--batch-size", "1", "--threads", "1", "--connect-timeout", "90"]
    s1 = start("partition1.py", *common, "--split-index", "3", "--host", "127.0.0.1", "--num-batches", "2",
               "--warmup", "0")
    wait_for_line(s1, "listening", 90)
    # A stranger speaking HTTP, then one with a valid frame but the wrong split.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(64))
        time.sleep(0.2)
    wrong = run([PYTHON, "partition2.py", *common, "--split-index", "5", "--output-dir", str(tmp_path)], timeout=120)
    assert wrong.returncode == 1
    assert "handshake mismatch: cuts" in wrong.stderr and wrong.stderr.count("\n") == 1
    good = start("partition2.py", *common, "--split-index", "3", "--output-dir", str(tmp_path))
    assert good.wait(120) == 0, good.stderr.read()
    assert s1.wait(60) == 0


@pytest.mark.slow
def test_peer_killed_mid_run_gives_incomplete_json_and_clean_exit(tmp_path):
    port = str(free_port())
    common = ["--model-name", "mobilenetv2", "--split-index", "5", "--port", port, "--batch-size", "1", "--threads", "1",
              "--timeout", "10", "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--num-batches", "100000", "--warmup", "1",
               "--output-dir", str(tmp_path / "s1"), "--profile", "wifi")
    s2 = start("partition2.py", *common, "--output-dir", str(tmp_path))
    wait_for_line(s1, "batches measured", 120)  # measured batches exist: the JSON must keep them
    kill_group(s2)
    t0 = time.monotonic()
    rc = s1.wait(30)
    elapsed = time.monotonic() - t0
    err = s1.stderr.read()
    assert rc == 1 and elapsed < 15
    assert err.strip().splitlines()[-1].startswith("error: peer") and "Traceback" not in err
    (path,) = (tmp_path / "s1").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "incomplete" and rec["error"]
    assert rec["summary"]["batches_measured"] >= 1


@pytest.mark.slow
def test_ctrl_c_on_stage1_stops_both_sides(tmp_path):
    port = str(free_port())
    common = ["--model-name", "mobilenetv2", "--split-index", "5", "--port", port, "--batch-size", "1", "--threads", "1",
              "--timeout", "10", "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--num-batches", "100000",
               "--output-dir", str(tmp_path / "s1"))
    s2 = start("partition2.py", *common, "--output-dir", str(tmp_path))
    wait_for_line(s1, "run ", 120)
    time.sleep(3)
    s1.send_signal(signal.SIGINT)
    assert s1.wait(15) == 130
    assert s2.wait(15) == 1
    err = s2.stderr.read()
    assert err.startswith("error: peer") and err.count("\n") == 1  # closed or reset: one line
    for folder in (tmp_path / "s1", tmp_path):
        (path,) = folder.glob("*.json")
        assert json.loads(path.read_text())["status"] == "incomplete"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime not installed (make test installs it as root)")
def test_latency_is_clock_skew_proof(tmp_path):
    """Stage 2 runs 7 hours ahead. A latency read across the two clocks would be 25,200 s off; read
    on stage 1's clock alone it stays a batch's real time. The bound is that arithmetic, not this
    machine's speed."""
    import datetime as dt

    port = str(free_port())
    common = ["--model-name", "resnet18", "--split-index", "4", "--port", port, "--batch-size", "1", "--threads", "1",
              "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--num-batches", "6", "--warmup", "1",
               "--profile", "lte")
    s2 = start("partition2.py", *common, "--output-dir", str(tmp_path / "skewed"), prefix=["faketime", "-f", "+7h"])
    assert s2.wait(180) == 0, s2.stderr.read()
    assert s1.wait(60) == 0, s1.stderr.read()
    (path,) = (tmp_path / "skewed").glob("*.json")
    skewed = json.loads(path.read_text())
    # Stage 2's clock really was shifted...
    ahead = dt.datetime.fromisoformat(skewed["created_utc"].replace("Z", "+00:00")) - dt.datetime.now(dt.timezone.utc)
    assert dt.timedelta(hours=6) < ahead < dt.timedelta(hours=8), skewed["created_utc"]
    # ...and no latency noticed: each is a batch's time on one clock, far from the 7 h between them.
    latencies = [b["latency_s"] for b in skewed["batches"]]
    assert len(latencies) == 1 + 6 and all(0 < x < 120 for x in latencies), latencies  # warm-up and measured


def test_atomic_write_leaves_an_ordinary_file_and_no_temp(tmp_path):
    import os

    path = records.atomic_write_json(tmp_path / "a" / "r.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
    with pytest.raises(TypeError):
        records.atomic_write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"x": 1}  # a failed write leaves the old file intact
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
