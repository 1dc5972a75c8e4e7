"""A later TCP stage driven frame by frame through a scripted connection (no socket): the results
it returns equal the unsplit model, its record is what it computed, and a frame it must refuse
is answered with ERROR naming why, its incomplete record still written."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scripted_connection import connection_pair, in_thread
from paretopipe.errors import WireError
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import wire
from paretopipe.transport.runconfig import RunConfig
from paretopipe.transport.tcp import serve_connection
from paretopipe.transport.tcp.messages import json_payload, json_tensor
from paretopipe.transport.tcp.nextstage import run_start

K = 6


@pytest.fixture(scope="module")
def builder():
    return StageBuilder("mobilenetv2")


def _config(builder, batches: int) -> RunConfig:
    cut = builder.partitioner.block_cut(K)
    return RunConfig(model=builder.name, cuts=[cut], split_index=K, batch_size=1, num_batches=batches, warmup=0,
                     timeout_s=60.0)


def _serve(connection, builder, tmp_path):
    """serve_connection on a thread, as a worker serves its connection."""
    return in_thread(serve_connection, connection, builder, output_dir=tmp_path)


def _run(peer, cfg):
    peer.send(wire.RUN, meta=dataclasses.asdict(run_start("scripted-run", cfg, {"mode": "none"}, None)))
    assert wire.expect(peer.read(), wire.RUN_OK).kind == wire.RUN_OK


def test_a_later_stage_returns_the_unsplit_models_outputs_and_writes_what_it_computed(builder, tmp_path):
    cfg = _config(builder, 3)
    connection, peer = connection_pair()
    thread, out = _serve(connection, builder, tmp_path)
    _run(peer, cfg)
    head = builder.stage(cfg.cuts, 0)
    xs = [torch.randn(1, 3, builder.input_size, builder.input_size, generator=torch.Generator().manual_seed(s))
          for s in range(3)]
    with torch.no_grad():
        for seq, x in enumerate(xs):
            peer.send(wire.TENSOR, seq, head(x))
        results = [wire.expect(peer.read(), wire.RESULT) for _ in xs]
        want = [builder.model.eval()(x) for x in xs]
    assert [f.seq for f in results] == [0, 1, 2]
    for f, w in zip(results, want):
        assert torch.equal(f.tensor, w)
        assert f.meta["stage2_compute_s"] > 0 and f.meta["stage2_queue_s"] >= 0 and "stage2_decode_s" in f.meta
    part1 = {"manifest": {"role": "stage1"}, "sysmon": {},
             "batches": [{"seq": s, "warmup": False, "start_s": s * 0.1, "end_s": s * 0.1 + 0.05, "latency_s": 0.05}
                         for s in range(3)]}
    peer.send(wire.RECORDS, 0, json_tensor(part1))
    part2 = json_payload(wire.expect(peer.read(), wire.RECORDS))
    assert part2["manifest"]["role"] == "stage2" and part2["manifest"]["weights_fingerprint"] == builder.fingerprint
    peer.send(wire.BYE)
    thread.join(60)
    assert "error" not in out and len(out["result"]) == 1
    record = json.loads(out["result"][0].path.read_text())
    assert record["status"] == "complete" and record["config"] == cfg.to_dict()
    assert [b["seq"] for b in record["batches"]] == [0, 1, 2] and record["summary"]["batches_measured"] == 3
    assert record["timing"]["written_by"] == "stage2"


@pytest.mark.parametrize("hostile,reason", [
    (lambda head: (0, head), "batch 0 sent twice or out of range 0..1"),
    (lambda head: (7, head), "batch 7 sent twice or out of range 0..1"),
    (lambda head: (1, head[:, :3]), "batch 1 carries 1 tensor: Bx3x"),
    (lambda head: (1, None), "batch 1 carries no tensor"),
])
def test_a_frame_the_stage_must_refuse_is_answered_with_error_and_the_run_ends_recorded(builder, tmp_path, hostile,
                                                                                     reason):
    cfg = _config(builder, 2)
    connection, peer = connection_pair()
    thread, out = _serve(connection, builder, tmp_path)
    _run(peer, cfg)
    with torch.no_grad():
        head = builder.stage(cfg.cuts, 0)(torch.randn(1, 3, builder.input_size, builder.input_size))
        peer.send(wire.TENSOR, 0, head)
        assert wire.expect(peer.read(), wire.RESULT).seq == 0
        seq, tensor = hostile(head)
        peer.send(wire.TENSOR, seq, tensor)
    refusal = peer.read()
    assert refusal.kind == wire.ERROR and reason in refusal.meta["reason"], refusal.meta
    thread.join(60)
    assert isinstance(out.get("error"), WireError) and reason in str(out["error"])
    (written,) = tmp_path.glob("*.json")
    record = json.loads(written.read_text())
    assert record["status"] == "incomplete" and reason in record["error"]

