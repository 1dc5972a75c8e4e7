"""A planned run's configuration and deadline, built from the options and the group's report alone."""

from __future__ import annotations

import pytest

from paretopipe.network import deadlines
from paretopipe.network.conditions import get_conditions
from paretopipe.controller import hosts
from paretopipe.controller.sweep import SweepOptions
from paretopipe.controller.sweep.configure import run_blocks, run_config, run_cuts, stage_declarations, timeout_s
from paretopipe.controller.sweep.group import GroupInfo
from paretopipe.controller.sweep.plan import PlannedRun
from paretopipe.splitspec import Split

INFO = GroupInfo(model="mobilenet_v2", fingerprint="f", num_blocks=3, block_cuts=["input", "b1", "b2", "output"],
                 payload_bytes_per_image=[400, 800, 200, 40], fine_cuts={"x+y": [2, 1000]},
                 limits={"stage1": None}, world_size=3)


def test_a_block_split_run_config_carries_the_options_keys_and_deadline():
    opts = SweepOptions(models=["mobilenetv2"], batch_size=2, num_batches=7, warmup=3, deadline_s=0.5, seed=1)
    planned = PlannedRun("mobilenetv2", "tcp", "lan", Split((1,)), 2)
    cfg = run_config(opts, INFO, planned, warmed=False, timeout_s=12.5)
    assert (cfg.model, cfg.cuts, cfg.split_index, cfg.batch_size, cfg.num_batches, cfg.warmup) == \
        ("mobilenet_v2", ["b1"], 1, 2, 7, 3)
    assert (cfg.timeout_s, cfg.seed, cfg.run, cfg.deadline_s, cfg.rpc) == (12.5, 2, 2, 0.5, None)
    assert (cfg.run_key, cfg.config_key) == (planned.run_key, planned.config_key)
    assert cfg.stage_limits == {"stage1": None} and cfg.adaptive_split is None
    assert run_config(opts, INFO, planned, warmed=True, timeout_s=1).warmup == 0  # warm cuts skip warm-up
    every = SweepOptions(models=["mobilenetv2"], warmup=3, warmup_every_run=True)
    assert run_config(every, INFO, planned, warmed=True, timeout_s=1).warmup == 3


def test_rpc_cuts_plans_and_the_adaptive_split():
    opts = SweepOptions(models=["m"], splits="0,2,x+y,adaptive", max_live=2, in_flight=1, objective="throughput")
    rpc = run_config(opts, INFO, PlannedRun("m", "rpc", "lan", Split((1, 2), plan=True), 0), warmed=False, timeout_s=1)
    assert rpc.cuts == ["b1", "b2"] and rpc.rpc.world_size == 3 and rpc.rpc.use_pipelining is False
    assert rpc.deadline_s is None
    cut = PlannedRun("m", "tcp", "lan", Split(cut="x+y"), 0)
    assert run_cuts(INFO, cut) == ["x+y"] and run_blocks(INFO, cut) == []
    adaptive = PlannedRun("m", "tcp", "lan", Split(adaptive=True), 0)
    assert run_blocks(INFO, adaptive) == [3] and run_cuts(INFO, adaptive) == ["output"]
    cfg = run_config(opts, INFO, adaptive, warmed=True, timeout_s=1)
    assert cfg.adaptive_split.objective == "throughput" and cfg.adaptive_split.candidates == [0, 2, "x+y"]
    assert cfg.warmup == opts.warmup  # the adaptive run always warms up: its cuts change under it


def test_stage_declarations_take_the_flag_else_the_host():
    tb = hosts.Testbed(hosts=[hosts.Host("127.0.0.2", power_idle_w=2.5, memory_limit=10),
                              hosts.Host("127.0.0.3", power_idle_w=40.0)])
    opts = SweepOptions(models=["m"], testbed=tb, power_idle_w=[None, 35.0])
    assert stage_declarations(opts, 2) == {"power_idle_w": [2.5, 35.0], "power_core_w": None,
                                           "memory_limits": [10, None]}
    assert stage_declarations(SweepOptions(models=["m"]), 2) == {"power_idle_w": None, "power_core_w": None,
                                                                 "memory_limits": None}


def test_the_deadline_follows_the_largest_payload_the_link_and_the_compute():
    lte = get_conditions("lte")
    opts = SweepOptions(models=["m"], batch_size=4, in_flight=2, num_classes=10)
    k1 = PlannedRun("m", "tcp", "lte", Split((1,)), 0)
    want = deadlines.run_timeout_s(lte, 800 * 4, 10 * 4 * 4, 2, 0.25)
    assert timeout_s(opts, INFO, k1, [1], lte, 0.25) == pytest.approx(want)
    # The run's own wire dtype (its codec: a sweep may measure several) halves what crosses.
    half = PlannedRun("m", "tcp", "lte", Split((1,)), 0, codec="float16/none")
    assert timeout_s(opts, INFO, half, [1], lte, 0.25) == pytest.approx(
        deadlines.run_timeout_s(lte, 800 * 4 // 2, 10 * 4 * 4, 2, 0.25))
    adaptive = PlannedRun("m", "tcp", "lte", Split(adaptive=True), 0)  # bounded by the largest candidate
    assert timeout_s(opts, INFO, adaptive, [3], lte, 0.0) == pytest.approx(
        deadlines.run_timeout_s(lte, 800 * 4, 10 * 4 * 4, 2, 0.0))
    cut = PlannedRun("m", "tcp", "lte", Split(cut="x+y"), 0)
    assert timeout_s(opts, INFO, cut, [], None, 0.0) == pytest.approx(deadlines.run_timeout_s(None, 4000, 160, 2))
    assert timeout_s(SweepOptions(models=["m"], timeout=9.0), INFO, k1, [1], lte, 5.0) == 9.0
