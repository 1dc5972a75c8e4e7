"""The sweep's plan as a pure function of its options and the model's shape: splits, runs, rounds,
tc stretches and the dry run's text, with no process and no clock."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.controller.sweep import rounds
from paretopipe.controller.sweep import SweepOptions
from paretopipe.controller.sweep.group import GroupPass, GroupProgress
from paretopipe.controller.sweep.plan import (PlannedRun, describe_plan, plan_runs, round_plan, segments,
                                           splits_for, worker_groups)
from paretopipe.splitspec import Split

CUTS = {"a+b": [2, 100], "c+d+e": [3, 50], "f": [1, 10]}


def test_splits_are_blocks_then_cuts_then_adaptive_and_plans_stand_alone():
    opts = SweepOptions(models=["m"], splits="1,3,a+b,adaptive", max_live=2)
    assert splits_for(opts, 4, CUTS) == [Split((1,)), Split((3,)), Split(cut="a+b"), Split(adaptive=True)]
    # "all" adds every cut of 2..--max-live tensors after the blocks
    every = splits_for(SweepOptions(models=["m"], splits="all", max_live=3), 2, CUTS)
    assert every == [Split((0,)), Split((1,)), Split((2,)), Split(cut="a+b"), Split(cut="c+d+e")]
    assert splits_for(SweepOptions(models=["m"], splits="all"), 2, None) == [Split((k,)) for k in range(3)]
    plans = SweepOptions(models=["m"], plans=[(1, 3), (2, 4)])
    assert splits_for(plans, 4) == [Split((1, 3), plan=True), Split((2, 4), plan=True)]
    with pytest.raises(UsageError, match="block indices go up to 3"):
        splits_for(plans, 3)
    with pytest.raises(UsageError, match="3 tensors cross c\\+d\\+e; add --max-live 3"):
        splits_for(SweepOptions(models=["m"], splits="c+d+e"), 4, CUTS)
    with pytest.raises(UsageError, match="'zz' is not a cut of this model"):
        splits_for(SweepOptions(models=["m"], splits="zz"), 4, CUTS)


def test_runs_are_every_group_network_split_and_repetition_in_seeded_rounds():
    opts = SweepOptions(models=["m"], splits="1,2", networks=["lan", "lte"], backends=["tcp", "rpc"],
                        ciphers=["none", "chacha20-poly1305"], runs=2, seed=5)
    assert worker_groups(opts) == [GroupPass("tcp"), GroupPass("tcp", "chacha20-poly1305"), GroupPass("rpc")]
    runs = plan_runs(opts, {"m": 4})
    assert len(runs) == 3 * 2 * 2 * 2
    first = [r for r in runs if (r.backend, r.cipher) == ("tcp", "none")]
    configs = [(n, Split((k,))) for n in ("lan", "lte") for k in (1, 2)]
    # round r is round_order's permutation of every configuration, all at repetition r
    assert first[:4] == [PlannedRun("m", "tcp", n, k, 0) for n, k in rounds.round_order(configs, 5, "m/tcp", 0, False)]
    assert {r.run for r in first[4:]} == {1} and plan_runs(opts, {"m": 4}) == runs
    assert GroupPass("tcp", "chacha20-poly1305").name("m") == "m/tcp/chacha20-poly1305" and GroupPass("rpc").name("m") == "m/rpc"
    # Transports: a group each, for the TCP backend only; a raw-TCP group keeps its old name and order.
    carried = SweepOptions(models=["m"], backends=["tcp", "rpc"], transports=["tcp", "mqtt"])
    assert worker_groups(carried) == [GroupPass("tcp", "none", "tcp"), GroupPass("tcp", "none", "mqtt"), GroupPass("rpc")]
    loaded = SweepOptions(models=["m"], backends=["tcp"], scenarios=["closed", "server"])
    assert worker_groups(loaded) == [GroupPass("tcp"), GroupPass("tcp", scenario="server")]
    assert GroupPass("tcp", scenario="server").name("m") == "m/tcp/server"
    assert GroupPass("tcp", transport="mqtt").name("m") == "m/tcp/mqtt" and GroupPass("tcp").name("m") == "m/tcp"
    # A language model's prompt lengths: a pass each, its name and file keys ending in the length.
    prompts = SweepOptions(models=["tiny-lm"], backends=["tcp"], prompt_lens=[8, 32])
    assert worker_groups(prompts) == [GroupPass("tcp", prompt_len=8), GroupPass("tcp", prompt_len=32)]
    assert GroupPass("tcp", prompt_len=8).name("tiny-lm") == "tiny-lm/tcp/p8"
    assert plan_runs(prompts, {"tiny-lm": 6})[0].run_key.endswith("_p8_r0")
    assert {r.config_key.endswith("_mqtt") for r in plan_runs(carried, {"m": 4}) if r.transport == "mqtt"} == {True}
    seq = plan_runs(SweepOptions(models=["m"], splits="1,2", runs=2, order="sequential"), {"m": 4})
    assert [(r.split.label, r.run) for r in seq] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert runs[0].run_key.startswith(runs[0].config_key) and "_r" in runs[0].run_key
    ref = PlannedRun("m", "tcp", "lan", Split((1,)), 3, reference=True)
    assert ref.run_key == f"{ref.config_key}_ref3"


def test_a_round_plans_runs_set_aside_by_drift_first_and_takes_them():
    opts = SweepOptions(models=["m"], runs=2, seed=1)
    configs = [("lan", Split((1,))), ("lan", Split((2,)))]
    group = GroupProgress("m/tcp", "none", "tcp", configs, {c: rounds.ConfigProgress() for c in configs}, 4,
                          rounds.DriftMonitor(0.0), configs[0], {}, {configs[0]: [0], configs[1]: []})
    plan = round_plan(opts, "m", "tcp", group, configs, 1)
    assert sorted((p.split.label, p.run) for p in plan) == [(1, 0), (1, 1), (2, 1)]
    assert group.rerun == {configs[0]: [], configs[1]: []}
    seq = round_plan(SweepOptions(models=["m"], runs=2, order="sequential", precision=0.05), "m", "tcp", group,
                     configs, 0)
    assert [(p.split.label, p.run) for p in seq] == [(k, i) for k in (1, 2) for i in range(4)]  # to max_runs


def test_tc_stretches_group_consecutive_runs_of_one_network():
    runs = [PlannedRun("m", "tcp", n, Split((1,)), i) for i, n in enumerate(["lan", "lan", "lte", "lan"])]
    assert segments(runs, False) == [(None, runs)]
    assert segments(runs, True) == [("lan", runs[:2]), ("lte", runs[2:3]), ("lan", runs[3:])]


def test_the_dry_run_text_names_the_sizes_order_and_first_runs():
    opts = SweepOptions(models=["m"], splits="1,2", networks=["lan"], runs=6, warmup=2, num_batches=5, precision=0.1)
    text = describe_plan(plan_runs(opts, {"m": 4}), opts)
    lines = text.splitlines()
    assert lines[0].startswith("12 runs locally: models m x backends tcp x networks lan x splits (1,2) x 6 runs; "
                               "7 batches of 8 each (2 warm-up, on a cut's first run")
    assert "order: random (seed 0), one round per run; --precision 10%: up to 18 runs" in lines[1]
    assert len(lines) == 2 + 10 + 1 and lines[-1] == "  ... and 2 more"


def test_a_language_models_dry_run_names_its_prompts_streams_and_tokens_and_runs_each_prompt_as_a_pass():
    opts = SweepOptions(models=["tiny-lm"], splits="1,2", networks=["lan"], runs=1, warmup=1, prompt_lens=[8, 16],
                        gen_tokens=4, streams=2)
    planned = plan_runs(opts, {"tiny-lm": 4})
    assert sorted({p.prompt_len for p in planned}) == [8, 16] and len(planned) == 4
    first = describe_plan(planned, opts).splitlines()[0]
    assert first.startswith("4 runs locally: models tiny-lm x backends tcp x networks lan x splits (1,2) x "
                            "prompts 8, 16 x 1 runs; 2 stream(s) of 4 tokens after a prompt of 8/16 tokens each "
                            "(1 warm-up generation(s)"), first
