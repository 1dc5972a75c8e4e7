"""TCP stage 1 driven through a scripted connection (no socket): the RUN it sends carries its
configuration, it keeps the in-flight window, it stamps each result on its own clock and takes
stage 2's reported work out of the network time, and a stage 2 that returns a result it never
asked for ends the run incomplete with the batches that completed kept."""

from __future__ import annotations

import json
import time

import pytest
import torch

from scripted_connection import connection_pair, in_thread
from paretopipe.errors import PeerError, WireError
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import wire
from paretopipe.transport.runconfig import RunConfig
from paretopipe.transport.tcp import run_on_connection
from paretopipe.transport.tcp.messages import RunStart, json_payload, json_tensor

K = 6
STAGE2_COMPUTE_S = 5.0  # what the scripted stage 2 reports: far above the real round trip here


@pytest.fixture(scope="module")
def builder():
    return StageBuilder("mobilenetv2")


def _config(builder, batches: int, in_flight: int = 1) -> RunConfig:
    return RunConfig(model=builder.name, cuts=[builder.partitioner.block_cut(K)], split_index=K, batch_size=1,
                     num_batches=batches, warmup=1, in_flight=in_flight, timeout_s=60.0)


def _stage1(connection, builder, cfg, tmp_path):
    """Stage 1's run on a thread, as its worker runs it."""
    return in_thread(run_on_connection, connection, builder, cfg, keep_outputs=True, output_dir=tmp_path)


def test_stage1_sends_its_run_keeps_the_window_and_records_stage2s_part(builder, tmp_path):
    cfg = _config(builder, 4, in_flight=2)
    connection, peer = connection_pair()
    thread, out = _stage1(connection, builder, cfg, tmp_path)
    start = RunStart(**wire.expect(peer.read(), wire.RUN).meta)
    assert RunConfig.from_dict(start.config) == cfg and start.return_link is None
    peer.send(wire.RUN_OK)
    tail = builder.stage(cfg.cuts, 1)
    frames = [wire.expect(peer.read(), wire.TENSOR), wire.expect(peer.read(), wire.TENSOR)]
    # The window: with two batches in flight and none answered, a third is not sent.
    with pytest.raises(PeerError, match="timed out"):
        peer.read(timeout=1.0)
    answered = 0
    with torch.no_grad():
        while answered < cfg.warmup + cfg.num_batches:
            f = frames.pop(0)
            peer.send(wire.RESULT, f.seq, tail(f.tensor), meta={"stage2_compute_s": STAGE2_COMPUTE_S,
                                                                "stage2_queue_s": 0.0, "stage2_decode_s": 0.0,
                                                                "stage2_encode_s": 0.0})
            answered += 1
            if answered + len(frames) < cfg.warmup + cfg.num_batches:
                frames.append(wire.expect(peer.read(), wire.TENSOR))
    part1 = json_payload(wire.expect(peer.read(), wire.RECORDS))
    assert [b["seq"] for b in part1["batches"]] == list(range(5)) and part1["manifest"]["role"] == "stage1"
    peer.send(wire.RECORDS, 0, json_tensor({"manifest": {"role": "stage2"}, "sysmon": {}}))
    thread.join(60)
    assert "error" not in out, out.get("error")
    record = out["result"].record
    assert record["status"] == "complete" and [m["role"] for m in record["manifest"]["stages"]] == ["stage1", "stage2"]
    measured = [b for b in record["batches"] if not b["warmup"]]
    assert len(measured) == 4 and all(b["stage2_compute_s"] == STAGE2_COMPUTE_S for b in measured)
    # Latency is a difference of stage 1's own clock, whatever stage 2 reports (it reported more
    # work than the whole round trip took here); that report is kept beside it, not mixed in.
    assert all(b["latency_s"] == pytest.approx(b["end_s"] - b["start_s"]) for b in measured)
    assert all(0 < b["latency_s"] < STAGE2_COMPUTE_S for b in measured)
    x = torch.stack([o for o in out["result"].outputs])
    assert x.shape[0] == 5 and json.loads(out["result"].path.read_text())["run_id"] == record["run_id"]


def test_a_result_stage1_never_sent_ends_the_run_incomplete_with_what_completed(builder, tmp_path):
    cfg = _config(builder, 3)
    connection, peer = connection_pair()
    thread, out = _stage1(connection, builder, cfg, tmp_path)
    wire.expect(peer.read(), wire.RUN)
    peer.send(wire.RUN_OK)
    tail = builder.stage(cfg.cuts, 1)
    with torch.no_grad():
        for _ in range(2):  # the warm-up batch and one measured batch, answered properly
            f = wire.expect(peer.read(), wire.TENSOR)
            peer.send(wire.RESULT, f.seq, tail(f.tensor), meta={"stage2_compute_s": 0.01})
        f = wire.expect(peer.read(), wire.TENSOR)
        peer.send(wire.RESULT, 99, tail(f.tensor), meta={"stage2_compute_s": 0.01})
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.5)
    assert isinstance(out.get("error"), (WireError, PeerError)) and "99" in str(out["error"]), out
    (written,) = tmp_path.glob("*.json")
    record = json.loads(written.read_text())
    assert record["status"] == "incomplete" and "99" in record["error"]
    assert record["summary"]["batches_measured"] == 1
