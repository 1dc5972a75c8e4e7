"""The typed run configuration: a renamed, missing or mistyped field fails loudly, by name."""

from __future__ import annotations

import dataclasses

import pytest

from paretopipe.errors import UsageError
from paretopipe.transport.runconfig import AdaptiveOptions, RpcOptions, RunConfig


def _cfg(**kw):
    return RunConfig(model="mobilenet_v2", cuts=["features_8"], **kw)


def test_round_trip_is_exact():
    cfg = _cfg(split_index=8, batch_size=2, network="lte", run_key="k_r0", stage_limits={"stage1": {"x": 1}})
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("change, message", [
    ({"profile": "lte"}, "unknown key 'profile'; valid: model, cuts"),
    ({"batch_size": "8"}, "batch_size: expected an integer, got '8'"),
    ({"batch_size": True}, "batch_size: expected an integer"),
    ({"timeout_s": float("nan")}, "timeout_s: nan is not a finite number"),
    ({"cuts": "features_8"}, "cuts: expected a list"),
    ({"split_index": [1, "x"]}, "split_index"),
    ({"batch_size": 0}, "--batch-size 0: must be at least 1"),
    ({"link_mode": "carrier-pigeon"}, "link mode 'carrier-pigeon'"),
    ({"num_batches": 0, "warmup": 0}, "at least one batch"),
])
def test_bad_fields_are_refused_by_name(change, message):
    data = {**_cfg().to_dict(), **change}
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_dict(data)


def test_missing_key_is_named():
    data = _cfg().to_dict()
    del data["model"]
    with pytest.raises(UsageError, match="missing key 'model'"):
        RunConfig.from_dict(data)


def test_a_run_configuration_cannot_be_patched():
    import dataclasses

    cfg = RunConfig(model="resnet18", cuts=["layer1"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.timeout_s = 5.0
    longer = dataclasses.replace(cfg, timeout_s=120.0)
    assert (cfg.timeout_s, longer.timeout_s) == (60.0, 120.0) and longer.cuts == cfg.cuts


def test_an_rpc_runs_stage_count_is_set_once_from_its_cuts_and_never_contradicted():
    rpc = RunConfig(model="resnet18", cuts=["a", "b"], rpc=RpcOptions(world_size=4))
    assert rpc.rpc.num_partitions == 3 and rpc.to_dict()["rpc"]["num_partitions"] == 3
    assert RunConfig.from_dict(rpc.to_dict()) == rpc
    with pytest.raises(UsageError, match="num_partitions 2: 2 cut\\(s\\) make 3 stages"):
        RunConfig(model="resnet18", cuts=["a", "b"], rpc=RpcOptions(num_partitions=2))
    assert RunConfig(model="resnet18", cuts=["a"]).rpc is None   # a TCP run has no RPC options


def test_the_backend_and_the_adaptive_split_keep_their_options_apart_from_the_core():
    adaptive = RunConfig(model="resnet18", cuts=["output"], split_index="adaptive")
    assert adaptive.adaptive_split == AdaptiveOptions()   # the defaults, made once
    named = RunConfig(model="resnet18", cuts=["output"], split_index="adaptive",
                      adaptive_split=AdaptiveOptions(candidates=[3, "a+b"]))
    assert RunConfig.from_dict(named.to_dict()).adaptive_split.candidates == [3, "a+b"]
    with pytest.raises(UsageError, match="apply to adaptive and sciot only"):
        RunConfig(model="resnet18", cuts=["x"], split_index=2, adaptive_split=AdaptiveOptions())
    with pytest.raises(UsageError, match="--objective 'speed'"):
        AdaptiveOptions(objective="speed")
    with pytest.raises(UsageError, match="--rpc-source 'moon'"):
        RpcOptions(source="moon")
    with pytest.raises(UsageError, match="unknown key 'objective'"):   # the old flat form is refused by name
        RunConfig.from_dict({**named.to_dict(), "objective": "latency"})
    cfg = RunConfig(model="resnet18", cuts=["x"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.timeout_s = 1.0
