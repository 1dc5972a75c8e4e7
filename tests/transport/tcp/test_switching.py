"""A later stage's half of an adaptive run, without sockets: the cuts a SWITCH may name, the
stage part it gets, the self-profile in RUN_OK, and every other SWITCH refused by name."""

from __future__ import annotations

import pytest
import torch

from paretopipe.errors import UsageError, WireError
from paretopipe.partition.stages import StageBuilder
from paretopipe.partition.tables import fine_cut_table
from paretopipe.transport.runconfig import AdaptiveOptions, RunConfig
from paretopipe.transport.tcp.switching import SwitchingStage, self_profile_cuts


@pytest.fixture(scope="module")
def builder():
    return StageBuilder("mobilenetv2")


def _cfg(builder, cut: str, **adaptive) -> RunConfig:
    return RunConfig(model=builder.name, cuts=[cut], split_index="adaptive", batch_size=1, num_batches=1, warmup=0,
                     adaptive_split=AdaptiveOptions(**adaptive))


def test_a_switch_gets_the_stage_part_of_a_block_cut_or_a_named_candidate_and_nothing_else(builder):
    blocks = builder.partitioner.block_cuts()
    wide = next(name for name, (width, _) in fine_cut_table(builder.partitioner).items() if width == 2)
    cfg = _cfg(builder, blocks[-1], candidates=[3, wide])
    side = SwitchingStage(builder, cfg)
    assert set(blocks) < set(side.switchable) and wide in side.switchable
    assert side.switchable == self_profile_cuts(builder, cfg)
    stage, incoming = side.switch({"cuts": [blocks[3]]})
    x = torch.ones(1, 3, builder.input_size, builder.input_size)
    with torch.no_grad():  # the part it returns is stage 2 of that split: it finishes the model exactly
        assert torch.equal(stage(builder.stage([blocks[3]], 0)(x)), builder.model.eval()(x))
    assert incoming == blocks[3] and side.switches == 1
    for bad in ({"cuts": ["no_such_cut"]}, {"cuts": blocks[2:4]}, {"cuts": "layer"}, {}):
        with pytest.raises(WireError, match="an adaptive run switches between block cuts and the cuts its "
                                            "candidates name only"):
            side.switch(bad)
    assert side.switches == 1 and side.manifest() == {"switches_applied": 1, "compute_probes": 0, "self_profile": None}


def test_run_ok_carries_the_self_profile_unless_the_run_brought_profiles_and_a_fine_start_is_refused(builder):
    blocks = builder.partitioner.block_cuts()
    side = SwitchingStage(builder, _cfg(builder, blocks[-1]))
    meta = side.run_ok_meta()
    assert meta["profile"] is side.profile and side.manifest()["self_profile"] is side.profile
    assert SwitchingStage(builder, _cfg(builder, blocks[-1], device_profiles=["a.json", "b.json"])).run_ok_meta() is None
    fine = next(c for c in fine_cut_table(builder.partitioner) if c not in blocks)
    with pytest.raises(UsageError, match=f"an adaptive run starts at a block split, not '{fine}'"):
        SwitchingStage(builder, _cfg(builder, fine))


def test_a_compute_probe_times_the_first_segments_and_a_malformed_one_is_a_protocol_error(builder):
    side = SwitchingStage(builder, _cfg(builder, builder.partitioner.block_cuts()[-1]))
    assert side.retime_request(3, None) is None and side.retime_request(3, {}) is None  # a plain link probe
    req = side.retime_request(3, {"retime": [0, 4]})
    meta = side.retime(req)
    assert meta["stage2_segment_first"] == 0 and len(meta["stage2_segment_s"]) == 4
    assert all(t > 0 for t in meta["stage2_segment_s"]) and side.manifest()["compute_probes"] == 1
    for bad in ([1, 2], [0, 0], [0, side.chains.count + 1], [0, True], "0,4", [0]):
        with pytest.raises(WireError, match="a compute probe names"):
            side.retime_request(3, {"retime": bad})


def test_under_onnx_runtime_each_segment_is_an_export_and_a_switch_still_finishes_the_model(builder):
    """An adaptive stage 2 on ONNX Runtime: its self-profile and every part a SWITCH asks for are
    chains of exported segments (each checked against its torch segment), and the part finishes
    the model as the unsplit torch model does, within the engine's tolerance."""
    from paretopipe.partition.onnxstage import EngineStage

    blocks = builder.partitioner.block_cuts()
    cfg = _cfg(builder, blocks[-1])
    cfg = RunConfig(**{**cfg.to_dict(), "engine": "onnxruntime", "adaptive_split": AdaptiveOptions()})
    side = SwitchingStage(builder, cfg)
    profile = side.run_ok_meta()["profile"]
    assert len(profile["segment_compute_s"]) == len(blocks) - 1 and profile["whole_model_s"] > 0
    stage, _ = side.switch({"cuts": [blocks[3]]})
    assert all(isinstance(seg, EngineStage) for seg in stage.segments)
    x = torch.randn(1, 3, builder.input_size, builder.input_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = stage(builder.stage([blocks[3]], 0)(x)), builder.model.eval()(x)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    account = builder.engine_of(cfg, 1)
    assert account["engine"] == "onnxruntime" and account["max_rel_error"] < 1e-4
    assert account["segments_exported"] == len(blocks) - 1
