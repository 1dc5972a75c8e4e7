"""A static split with a deadline (``--deadline-ms``, one batch in flight): the driver's local
fallback, which an adaptive run has too. Real processes and sockets: stage 2 freezes (results come
too late: dropped), dies, and a new one connects and is served the rest; every batch has a result
equal to the unsplit model's."""

from __future__ import annotations

import json

import pytest
import torch

from paretopipe.transport import inputs as data
from tcp_helpers import assert_logits_equal_unsplit, builder, free_port, stage2_freezes_dies_and_returns, start

MODEL = "mobilenetv2"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_a_static_split_with_a_deadline_serves_every_batch_through_a_frozen_dead_and_returning_stage2(tmp_path,
                                                                                                      engine):
    """Under ONNX Runtime too: stage 1 serves the batches it takes back on its own engine."""
    port = str(free_port())
    # Stage 1 is held while the new stage 2 starts (stage2_freezes_dies_and_returns), and a 20 ms
    # link caps the batches stage 2 serves at 25 a second, so the run reaches the return within
    # about 150 batches on any machine (without both, 500 were too few: a fresh clone's stage 1,
    # serving alone on ONNX Runtime at a few ms a batch, finished before the new stage 2 connected).
    total = 300
    common = ["--model", MODEL, "--split", "8", "--port", port, "--threads", "1", "--connect-timeout", "90"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", str(total),
               "--warmup", "0", "--deadline-ms", "300", "--delay", "20ms", "--out", str(tmp_path / "s1"),
               "--save-outputs", str(tmp_path / "out.npz"), "--engine", engine)
    s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
    s2b = stage2_freezes_dies_and_returns(s1, s2, common, tmp_path / "s2b", "stage 1: run", 1.0, 0.5)
    assert s1.wait(300) == 0, s1.stderr.read()
    assert s2b.wait(60) == 0, s2b.stderr.read()
    (path,) = (tmp_path / "s1").glob("*.json")
    rec = json.loads(path.read_text())
    batches = rec["batches"]
    assert rec["status"] == "complete" and rec["config"]["split_index"] == 8 and len(batches) == total
    assert rec["config"]["deadline_s"] == pytest.approx(0.3)
    fallback = rec["manifest"]["stages"][0]["fallback"]
    assert fallback["deadline_misses"] >= 1 and fallback["peer_losses"] >= 1 and fallback["reconnects"] >= 1
    assert fallback["late_results_dropped"] >= 1 and fallback["switches"] == 0 and fallback["probes"] == 0
    local = [b for b in batches if b["served_locally"]]
    assert len(local) == fallback["served_locally"] == rec["summary"]["batches_served_locally"] >= 2
    assert all(b["local_compute_s"] > 0 for b in local) and any(b.get("deadline_missed") for b in local)
    back = next(e["seq"] for e in fallback["events"] if e["event"] == "reconnected")
    assert any(not b["served_locally"] for b in batches[back:])   # stage 2's again once it returned
    # The stage 2 that came back wrote the record of the run it joined, with stage 1's part.
    (path2,) = (tmp_path / "s2b").glob("*.json")
    assert json.loads(path2.read_text())["run_id"] == rec["run_id"]
    assert [s["engine"]["engine"] for s in rec["manifest"]["stages"]] == [engine, engine]
    assert_logits_equal_unsplit(tmp_path / "out.npz", MODEL, total, atol=1e-5 if engine == "torch" else 1e-4)


def test_a_deadline_needs_one_batch_in_flight(tmp_path):
    import tcp_helpers as cli

    done = cli.run([cli.PYTHON, "partition1.py", "--model", MODEL, "--split", "8", "--port", str(free_port()),
                    "--host", "127.0.0.1", "--deadline-ms", "100", "--in-flight", "2", "--connect-timeout", "1"],
                   timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --deadline-ms with --in-flight 2: a deadline settles each batch before the next; use --in-flight 1"]


def test_a_guarded_run_records_each_result_as_a_streaming_run_does_sealed_too(tmp_path):
    """With a deadline the driver settles each batch itself; what a result carries (every later
    stage's durations, its seal opening on both sides) reaches the batch record all the same, and
    the outputs are the unsplit model's."""
    from tcp_helpers import run_in_threads

    secret = bytes(range(32))
    s1, _ = run_in_threads("resnet18", 4, tmp_path, secret=secret, encrypt="chacha20", batch_size=2,
                           num_batches=3, warmup=1, deadline_s=30.0)
    rec = s1.record
    assert rec["status"] == "complete" and rec["manifest"]["stages"][0]["fallback"]["served_locally"] == 0
    for b in rec["batches"]:
        assert not b["served_locally"] and b["result_open_s"] > 0 and b["stage2_open_s"] > 0
        assert all(b[f"stage2_{k}"] is not None for k in ("decode_s", "queue_s", "compute_s", "encode_s"))
    model = builder("resnet18").model
    with torch.no_grad():
        ref = [model(x) for x in data.batches("synthetic", 2, 224, 4, seed=0)]
    assert all(torch.allclose(out, r, atol=1e-5) for out, r in zip(s1.outputs, ref))
