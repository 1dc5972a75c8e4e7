"""Cuts where several tensors cross, over both backends: one frame per batch carries the whole live
set, a chain carries a tensor past its middle stage, and the outputs equal the unsplit model."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe.transport import inputs as data
from tcp_helpers import builder, free_port, run_chain_in_threads, start, wait_for_line

#: Inside ResNet18's layer1.0: the block's input (maxpool) crosses beside its branch.
INSIDE_BLOCK = "maxpool+layer1_0_relu"
LATER_INSIDE = "maxpool+layer1_0_bn2"


def _reference(name, batch, count):
    from paretopipe.partition import models

    model = builder(name).model
    with torch.no_grad():
        return [model(x) for x in data.batches("synthetic", batch, models.input_size(name), count, seed=0)]


def _check(out, ref, cuts):
    errors = {k: v for k, v in out.items() if k.endswith("_error")}
    assert not errors, errors
    s1 = out["stage1"]
    assert len(s1.outputs) == len(ref)
    for got, want in zip(s1.outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), cuts
    return s1


@pytest.mark.parametrize("codec", [{}, {"compression": "zstd"}, {"wire_dtype": "float16"}])
def test_two_stages_across_a_live_set_of_two_tensors(tmp_path, codec):
    part = builder("resnet18").partitioner
    assert part.cut(INSIDE_BLOCK).width == 2
    ref = _reference("resnet18", 2, 3)
    out = run_chain_in_threads("resnet18", [INSIDE_BLOCK], tmp_path, batch_size=2, num_batches=2, warmup=1,
                               in_flight=2, **codec)
    if codec.get("wire_dtype") == "float16":  # both tensors travel as float16: close, not exact
        s1 = out["stage1"]
        assert all(torch.allclose(g, w, atol=0.05, rtol=0.01) for g, w in zip(s1.outputs, ref))
        raw = part.payload_nbytes(INSIDE_BLOCK, 2) // 2
    else:
        s1 = _check(out, ref, [INSIDE_BLOCK])
        raw = part.payload_nbytes(INSIDE_BLOCK, 2)
    for rec in s1.record["batches"]:
        assert rec["payload_bytes"] == raw  # the whole live set, in one frame
        if not codec:
            assert rec["wire_bytes"] == raw
    assert s1.record["config"]["cuts"] == [INSIDE_BLOCK]


def test_a_chain_carries_the_block_input_past_its_middle_stage(tmp_path):
    part = builder("resnet18").partitioner
    ref = _reference("resnet18", 1, 3)
    plan = [INSIDE_BLOCK, LATER_INSIDE]
    out = run_chain_in_threads("resnet18", plan, tmp_path, batch_size=1, num_batches=2, warmup=1)
    s1 = _check(out, ref, plan)
    for rec in s1.record["batches"]:
        # Hop 1 carries maxpool and relu, hop 2 maxpool (carried through stage 2) and bn2.
        assert rec["hop_bytes"][:2] == [part.payload_nbytes(c, 1) for c in plan]


def test_a_live_set_cut_from_the_command_line(tmp_path):
    port = free_port()
    common = ["--model", "resnet18", "--cut", INSIDE_BLOCK, "--port", str(port), "--host", "127.0.0.1"]
    s1 = start("partition1.py", *common, "--batch-size", "2", "--num-batches", "2", "--warmup", "0",
               "--dataset", "synthetic", "--out", str(tmp_path / "s1"), "--save-outputs", str(tmp_path / "out.npz"))
    s2 = None
    try:
        wait_for_line(s1, "listening", 60)
        s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
        assert s1.wait(120) == 0, s1.stderr.read() if s1.stderr else ""
        assert s2.wait(60) == 0
    finally:
        for p in (s1, s2):
            if p is not None and p.poll() is None:
                p.kill()
    logits = np.load(tmp_path / "out.npz", allow_pickle=False)["logits"]
    assert np.allclose(logits, torch.stack(_reference("resnet18", 2, 2)).numpy(), atol=1e-5)
    (rec_path,) = (tmp_path / "s1").glob("*.json")
    assert json.loads(rec_path.read_text())["config"]["cuts"] == [INSIDE_BLOCK]


@pytest.mark.slow
def test_rpc_ranks_pass_a_live_set_on_and_carry_a_tensor_past_a_stage(tmp_path):
    from paretopipe.partition import models
    from tcp_helpers import run

    out = tmp_path / "o.npz"
    proc = run([PYTHON, "distributed_runner.py", "--local", "--threads", "1", "--metrics-dir", str(tmp_path),
                "--world-size", "4", "--num-partitions", "3", "--model", "resnet18", "--batch-size", "2",
                "--num-test-samples", "4", "--warmup", "1", "--use-pipelining", "--cut", f"{INSIDE_BLOCK},{LATER_INSIDE}",
                "--save-outputs", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = models.build("resnet18")
    with torch.no_grad():
        ref = torch.stack([model(data.synthetic_batch(i, 2, 224)) for i in range(3)])
    assert np.allclose(np.load(out, allow_pickle=False)["logits"], ref.numpy(), atol=1e-5)
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["config"]["cuts"] == [INSIDE_BLOCK, LATER_INSIDE] and rec["status"] == "complete"
    part = builder("resnet18").partitioner
    measured = [b for b in rec["batches"] if not b["warmup"]][0]
    # The input, then each live set in one call, then the logits.
    assert measured["hop_bytes"][1:3] == [part.payload_nbytes(c, 2) for c in (INSIDE_BLOCK, LATER_INSIDE)]


def test_rpc_refuses_a_cut_list_that_does_not_fit_the_partitions():
    from tcp_helpers import run

    # --num-partitions given: without it, the partitions follow from the cuts named (one more)
    proc = run([PYTHON, "distributed_runner.py", "--local", "--world-size", "3", "--model", "resnet18",
                "--num-partitions", "2", "--cut", f"{INSIDE_BLOCK},{LATER_INSIDE}"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: 2 partitions need 1 cut(s), got --cut {INSIDE_BLOCK},{LATER_INSIDE}"]


def test_a_detector_split_across_its_pyramid_over_tcp_saves_the_unsplit_boxes(tmp_path):
    from paretopipe.partition import detection, models

    name, k = "ssdlite320_mobilenet_v3_large", 19
    b = builder(name)
    cut = b.partitioner.cut(b.partitioner.block_cut(k))
    assert cut.width == 3  # three pyramid levels cross
    port = free_port()
    common = ["--model", name, "--split", str(k), "--port", str(port), "--host", "127.0.0.1", "--threads", "1"]
    out = tmp_path / "boxes.npz"
    s1 = start("partition1.py", *common, "--batch-size", "1", "--num-batches", "2", "--warmup", "0",
               "--dataset", "photos", "--out", str(tmp_path / "s1"), "--save-outputs", str(out))
    s2 = None
    try:
        wait_for_line(s1, "listening", 60)
        s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
        assert s1.wait(180) == 0
        assert s2.wait(60) == 0
    finally:
        for p in (s1, s2):
            if p is not None and p.poll() is None:
                p.kill()
    saved = np.load(out, allow_pickle=False)
    assert sorted(saved.files) == ["boxes", "counts", "labels", "scores"]
    # On one thread, as the stages ran: the box decoder's exp turns another summation order's last
    # bits into hundredths of a pixel.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            ref = [b.model(x) for x in data.batches("photos", 1, models.input_size(name), 2, seed=0)]
    finally:
        torch.set_num_threads(threads)
    for i, want in enumerate(ref):
        got = tuple(torch.from_numpy(saved[n][i]) for n in ("boxes", "scores", "labels", "counts"))
        assert int(got[3][0]) > 0 and detection.same_detections(got, want) <= 1e-5
    (path,) = (tmp_path / "s1").glob("*.json")
    rec = json.loads(path.read_text())
    measured = [x for x in rec["batches"] if not x["warmup"]]
    assert all(x["payload_bytes"] == cut.nbytes for x in measured)
    assert rec["status"] == "complete" and rec["summary"]["throughput_imgs_per_s"] > 0


@pytest.mark.slow
def test_rpc_ranks_split_a_detector_across_its_pyramid_and_return_its_boxes(tmp_path):
    from paretopipe.partition import detection, models
    from tcp_helpers import run

    name = "ssdlite320_mobilenet_v3_large"
    part = builder(name).partitioner
    cuts = [part.block_cut(15), part.block_cut(19)]  # the backbone's C4 map waits; then three pyramid levels
    assert [part.cut(c).width for c in cuts] == [2, 3]
    out = tmp_path / "boxes.npz"
    proc = run([PYTHON, "distributed_runner.py", "--local", "--threads", "1", "--metrics-dir", str(tmp_path),
                "--world-size", "4", "--num-partitions", "3", "--model", name, "--batch-size", "1",
                "--num-test-samples", "2", "--warmup", "0", "--cut", ",".join(cuts), "--save-outputs", str(out)],
               timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = np.load(out, allow_pickle=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks ran
    try:
        with torch.no_grad():
            ref = [builder(name).model(data.synthetic_batch(i, 1, models.input_size(name))) for i in range(2)]
    finally:
        torch.set_num_threads(threads)
    for i, want in enumerate(ref):
        got = tuple(torch.from_numpy(saved[n][i]) for n in ("boxes", "scores", "labels", "counts"))
        assert int(got[3][0]) > 0 and detection.same_detections(got, want) <= 1e-5


def test_a_frame_that_is_not_the_cuts_live_set_is_refused_and_the_real_stage_1_is_served_next():
    from paretopipe.controller.hosts import StageProcess
    from paretopipe.transport import tcp, wire
    from paretopipe.transport.runconfig import RunConfig
    from paretopipe.transport.tcp.nextstage import run_start

    secret = "live-set-secret-0123456789abcdef"
    b = builder("resnet18")
    cfg = RunConfig(model=b.name, cuts=[INSIDE_BLOCK], batch_size=1, num_batches=1, warmup=0, timeout_s=20)
    worker = StageProcess("stage2", [PYTHON, "-m", "paretopipe.controller.worker", "--role", "stage2", "--model",
                                     "resnet18", "--threads", "1"])
    listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b), secret.encode())
    try:
        worker.ready(120)
        wrong = [torch.randn(1, 64, 56, 56),  # one tensor where two cross
                 (torch.randn(1, 64, 56, 56), torch.randn(1, 64, 28, 28)),  # two, the second of another shape
                 (torch.randn(1, 64, 56, 56), torch.randn(1, 64, 56, 56).double())]  # of another dtype
        for hostile in wrong:
            worker.send({"cmd": "connect", "host": "127.0.0.1", "port": listener.port, "secret": secret,
                         "connect_timeout": 10})
            worker.expect("connected", timeout=30)
            connection = listener.connection(10)
            connection.send(wire.RUN, meta=dataclasses.asdict(run_start("hostile", cfg, {"mode": "none"}, None)))
            wire.expect(connection.reader.read(time.monotonic() + 30), wire.RUN_OK)
            connection.writer.send(wire.encode(wire.TENSOR, 0, hostile))
            reply = connection.reader.read(time.monotonic() + 30)
            assert reply.kind == wire.ERROR
            reason = reply.meta["reason"]
            assert f"what crosses {INSIDE_BLOCK} is 2 tensors: Bx64x56x56 float32, Bx64x56x56 float32" in reason
            assert "\n" not in reason
            connection.close()
            worker.expect("connection_ended", timeout=30)
            assert worker.alive()
        # The real stage 1 is served as if nothing had happened.
        worker.send({"cmd": "connect", "host": "127.0.0.1", "port": listener.port, "secret": secret,
                     "connect_timeout": 10})
        worker.expect("connected", timeout=30)
        outcome = tcp.run_stage1(listener, b, cfg, connect_timeout=10, keep_outputs=True)
        assert outcome.record["status"] == "complete"
        with torch.no_grad():
            want = b.model(data.synthetic_batch(0, 1, 224))
        assert torch.allclose(outcome.outputs[0], want, atol=1e-5, rtol=0)
    finally:
        listener.close()
        worker.stop()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_live_set_crosses_quantised_and_stage_2_computes_on_exactly_what_the_quantiser_made(tmp_path, dtype):
    """Both tensors of the live set cross as int8 (or int4) parts in one frame; stage 1's outputs
    equal the same split computed here with the same round trip at the cut, and the payload is
    the parts' bytes."""
    from paretopipe.partition import wirequant
    from paretopipe.partition.activation import activation_nbytes, call_stage

    b = builder("resnet18")
    first, second = b.partitioner.stages([INSIDE_BLOCK])
    xs = list(data.batches("synthetic", 2, 224, 3, seed=0))
    with torch.no_grad():
        cuts = [first(x) for x in xs]
        want = [call_stage(second, tuple(wirequant.roundtrip(t, dtype) for t in c)) for c in cuts]
    out = run_chain_in_threads("resnet18", [INSIDE_BLOCK], tmp_path, batch_size=2, num_batches=2, warmup=1,
                               in_flight=2, wire_dtype=dtype)
    s1 = _check_quantised(out, want)
    sent = activation_nbytes(wirequant.encode_activation(cuts[0], dtype))
    assert all(rec["payload_bytes"] == sent for rec in s1.record["batches"])
    assert sent * (3.9 if dtype == "int8" else 6.2) < b.partitioner.payload_nbytes(INSIDE_BLOCK, 2)


def _check_quantised(out, want):
    errors = {k: v for k, v in out.items() if k.endswith("_error")}
    assert not errors, errors
    s1 = out["stage1"]
    assert len(s1.outputs) == len(want)
    for got, ref in zip(s1.outputs, want):
        assert torch.allclose(got, ref, atol=1e-5, rtol=0)
    return s1
