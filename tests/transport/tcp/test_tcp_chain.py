"""A TCP chain of three stages (Pi -> Pi -> server): one driver for every stage, a middle stage is
a sink that forwards. Exact outputs, every stage's part in the record, failures in one line."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe import records
from paretopipe.errors import PeerError
from paretopipe.network.conditions import Direction, NetworkConditions
from paretopipe.transport import inputs as data
from tcp_helpers import builder, free_port, kill_group, run_chain_in_threads, start, wait_for_line

SECRET = b"chain-test-secret-0123456789abcdef"


def _reference(name, batch, count, dataset="synthetic"):
    from paretopipe.partition import models

    model = builder(name).model
    with torch.no_grad():
        return [model(x) for x in data.batches(dataset, batch, models.input_size(name), count, seed=0)]


@pytest.mark.slow
def test_three_stages_equal_the_unsplit_model_at_inner_and_edge_plans(tmp_path):
    K = builder("mobilenetv2").partitioner.num_blocks
    ref = _reference("mobilenetv2", 2, 3)
    schema = records.load_schema()
    for plan in ([3, 9], [0, 5], [5, K], [4, 4]):
        out = run_chain_in_threads("mobilenetv2", plan, tmp_path / "-".join(map(str, plan)), batch_size=2,
                                   num_batches=2, warmup=1, in_flight=2)
        errors = {k: v for k, v in out.items() if k.endswith("_error")}
        assert not errors, errors
        s1 = out["stage1"]
        assert len(s1.outputs) == 3
        for got, want in zip(s1.outputs, ref):
            assert torch.allclose(got, want, atol=1e-5, rtol=0), f"plan {plan}"
        (s2,), (s3,) = out["stage2"], out["stage3"]
        for outcome in (s1, s2, s3):
            jsonschema.validate(outcome.record, schema)
            assert outcome.record["status"] == "complete"
            assert outcome.record["run_id"] == s1.record["run_id"]
            assert [m["role"] for m in outcome.record["manifest"]["stages"]] == ["stage1", "stage2", "stage3"]
            assert sorted(outcome.record["sysmon"]) == ["stage1", "stage2", "stage3"]
        assert s3.record["timing"]["written_by"] == "stage3" and s2.record["timing"]["written_by"] == "stage2"
        assert s1.record["config"]["split_index"] == plan


def test_each_stage_reports_its_own_work_and_each_hop_its_bytes(tmp_path):
    b = builder("mobilenetv2")
    # A fixed delay each way and no jitter: every hop's emulated link holds each frame at least that long.
    link = NetworkConditions("fixed", up=Direction(delay_s=0.03), down=Direction(delay_s=0.02))
    out = run_chain_in_threads("mobilenetv2", [3, 9], tmp_path, conditions=link, batch_size=2,
                               num_batches=3, warmup=1, in_flight=1)
    s1 = out["stage1"]
    measured = [x for x in s1.record["batches"] if not x["warmup"]]
    assert len(measured) == 3
    part = b.partitioner
    for rec in measured:
        for j in (2, 3):
            for field in ("decode_s", "queue_s", "compute_s", "encode_s"):
                assert rec[f"stage{j}_{field}"] >= 0, (j, field)
        # Hop 1 carries block 3's output, hop 2 block 9's (from the middle stage), then the logits.
        assert rec["hop_bytes"][0] == rec["wire_bytes"] == part.payload_nbytes(part.block_cut(3), 2)
        assert rec["hop_bytes"][1] == rec["stage2_wire_bytes"] == part.payload_nbytes(part.block_cut(9), 2)
        assert rec["hop_bytes"][2] == rec["result_wire_bytes"]
        # Every stage's measured work fits inside the end-to-end latency on stage 1's clock.
        assert sum(rec[k] for k in records.work_fields(rec)) < rec["latency_s"]
    summary = s1.record["summary"]
    assert summary["batches_measured"] == 3
    # Both hops are emulated: the up delay is paid twice on the way out, the down delay twice back.
    assert min(r["latency_s"] for r in measured) >= 2 * 0.03 + 2 * 0.02
    assert s1.record["manifest"]["link"]["conditions"]["up"]["delay_ms"] == pytest.approx(30)


def test_a_sealed_chain_seals_every_hop_and_still_computes_the_model(tmp_path):
    ref = _reference("mobilenetv2", 1, 3)
    out = run_chain_in_threads("mobilenetv2", [2, 8], tmp_path, secret=SECRET, encrypt="chacha20", batch_size=1,
                               num_batches=2, warmup=1)
    assert not {k for k in out if k.endswith("_error")}, out
    s1 = out["stage1"]
    for got, want in zip(s1.outputs, ref):
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    ciphers = [m["cipher"]["cipher"] for m in s1.record["manifest"]["stages"]]
    assert ciphers == ["chacha20", "chacha20", "chacha20"]
    for rec in s1.record["batches"]:
        # Each later stage opened its frame and sealed the result it sent back.
        assert rec["stage2_open_s"] >= 0 and rec["stage3_open_s"] >= 0
        assert rec["stage2_seal_s"] >= 0 and rec["stage3_seal_s"] >= 0


def test_a_middle_stage_without_a_next_stage_refuses_the_run_in_one_line(tmp_path):
    out = run_chain_in_threads("mobilenetv2", [3, 9], tmp_path, next_stage=False, batch_size=1, num_batches=1,
                               warmup=0)
    err = out["stage1_error"]
    assert isinstance(err, PeerError)
    assert "stage 2 cannot run this" in str(err) and "--next-port" in str(err), str(err)
    assert "\n" not in str(err)
    # Stage 1 still wrote its incomplete record, and says why.
    (path,) = (tmp_path / "stage1").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "incomplete" and "--next-port" in rec["error"]


def test_a_next_stage_that_connected_before_the_plan_was_known_is_checked_against_it():
    # A last stage may connect to the middle one long before stage 1's RUN says what the plan is,
    # while the listener has no cuts to check its HELLO against yet.
    from paretopipe.errors import UsageError
    from paretopipe.transport import tcp

    b = builder("mobilenetv2")
    plan = [b.partitioner.block_cut(3), b.partitioner.block_cut(9)]
    listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), tcp.identity_of(b))
    try:
        downstream = tcp.Downstream(listener, 10)
        for insists, fits in (([b.partitioner.block_cut(4), plan[1]], False), (None, True), (plan, True)):
            sock = tcp.connect_with_retry("127.0.0.1", listener.port, 10)
            mine = tcp.open_connection(sock, b, cuts=insists)  # the handshake completes: no plan yet
            if fits:
                assert downstream.connect(plan).peer.cuts == insists
            else:
                with pytest.raises(UsageError, match="the next stage insists on cuts .* the plan has"):
                    downstream.connect(plan)
                assert downstream.connection is None
            mine.close()
            # The middle stage drops its old next stage, as it does once that one is gone: otherwise
            # connect() may keep the open old one while the listener has not yet queued the newer one.
            downstream.close(bye=False)
            listener.expected_cuts = None  # as before the next run's RUN
    finally:
        downstream.close(bye=False)
        listener.close()


def test_the_parts_a_later_stage_sends_back_are_one_per_later_stage():
    from paretopipe.errors import WireError
    from paretopipe.transport.tcp.outcome import later_parts

    part = {"manifest": {"role": "stage3"}, "sysmon": {}}
    back = {"manifest": {"role": "stage2"}, "sysmon": {}, "later": [part]}
    assert later_parts(back, 2, 3) == [back, part]
    assert later_parts({"manifest": {}, "sysmon": {}}, 2, 2)[0]["manifest"] == {}
    # A middle stage may not pad the record with stages that do not exist, nor leave one out.
    for bad in ({**back, "later": [part, part]}, {**back, "later": []}, {**back, "later": "x"}):
        with pytest.raises(WireError, match="later parts"):
            later_parts(bad, 2, 3)
    with pytest.raises(WireError, match="schema"):
        later_parts({**back, "later": [{"manifest": {}}]}, 2, 3)


@pytest.mark.slow
def test_the_cli_runs_a_chain_of_three_processes_with_exact_outputs(tmp_path):
    port1, port2 = str(free_port()), str(free_port())
    out = tmp_path / "out.npz"
    common = ["--model", "resnet18", "--threads", "1", "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--split", "2,6", "--port", port1, "--host", "127.0.0.1",
               "--batch-size", "2", "--num-batches", "2", "--warmup", "1", "--dataset", "synthetic",
               "--save-outputs", str(out))
    s2 = start("partition2.py", *common, "--host", "127.0.0.1", "--port", port1, "--next-port", port2,
               "--next-host", "127.0.0.1", "--output-dir", str(tmp_path / "s2"))
    s3 = start("partition2.py", *common, "--host", "127.0.0.1", "--port", port2, "--split", "2,6",
               "--output-dir", str(tmp_path / "s3"))
    assert s3.wait(180) == 0, s3.stderr.read()
    assert "stage 3 done: 2 measured batches" in s3.stdout.read()
    assert s2.wait(60) == 0, s2.stderr.read()
    assert s1.wait(60) == 0, s1.stderr.read()
    logits = np.load(out, allow_pickle=False)["logits"]
    assert np.allclose(logits, torch.stack(_reference("resnet18", 2, 3)).numpy(), atol=1e-5)
    (path,) = (tmp_path / "s3").glob("resnet18-*.json")
    rec = json.loads(path.read_text())
    assert rec["config"]["split_index"] == [2, 6] and len(rec["manifest"]["stages"]) == 3


def test_the_cli_refuses_a_plan_out_of_order_or_out_of_range_in_one_line(tmp_path):
    from tcp_helpers import run

    for split, want in (("6,2", "increasing order"), ("2,99", "out of range")):
        res = run([PYTHON, "partition1.py", "--model", "resnet18", "--split", split, "--port", str(free_port()),
                   "--connect-timeout", "1"], timeout=120)
        assert res.returncode == 2, res.stderr
        assert want in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_the_last_stage_killed_mid_run_ends_the_chain_in_one_line_and_keeps_what_was_measured(tmp_path):
    port1, port2 = str(free_port()), str(free_port())
    common = ["--model", "mobilenetv2", "--threads", "1", "--timeout", "10", "--connect-timeout", "60"]
    s1 = start("partition1.py", *common, "--split", "3,9", "--port", port1, "--host", "127.0.0.1",
               "--batch-size", "1", "--num-batches", "100000", "--warmup", "1", "--dataset", "synthetic",
               "--network", "wifi", "--output-dir", str(tmp_path / "s1"))
    s2 = start("partition2.py", *common, "--host", "127.0.0.1", "--port", port1, "--next-port", port2,
               "--next-host", "127.0.0.1", "--output-dir", str(tmp_path / "s2"))
    s3 = start("partition2.py", *common, "--host", "127.0.0.1", "--port", port2, "--output-dir", str(tmp_path / "s3"))
    wait_for_line(s1, "batches measured", 120)  # measured batches exist: the records must keep them
    kill_group(s3)
    # The middle stage notices at once and ends its side of the connection, so stage 1 need not
    # wait out its timeout; both say why in one line and exit 1.
    assert s2.wait(30) == 1 and s1.wait(30) == 1
    errors = {}
    for name, proc in (("s1", s1), ("s2", s2)):
        err = proc.stderr.read()
        errors[name] = err.strip().splitlines()[-1]
        assert errors[name].startswith("error: ") and "Traceback" not in err, err
    # Stage 1, where the user watches, hears from the middle stage which hop failed.
    assert "stage 2's next stage failed" in errors["s1"], errors
    for folder in ("s1", "s2"):
        (path,) = (tmp_path / folder).glob("*.json")
        rec = json.loads(path.read_text())
        assert rec["status"] == "incomplete" and rec["error"], folder
    rec = json.loads(next((tmp_path / "s1").glob("*.json")).read_text())
    assert rec["summary"]["batches_measured"] >= 1
