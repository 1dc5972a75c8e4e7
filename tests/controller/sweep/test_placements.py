"""--placements: which of the testbed's hosts run the stages, in order, as a sweep's and a search's
dimension, and the report's table of what each extra device buys.

The sweep runs on a scripted stage group (tests/scripted_group.py: no process, no model), so each
placement's latency is the script's and the table's verdicts are exact; the hosts each group was
made on are read from the options the sweeper gave it. Real hosts are in test_lab.py's three-host
sweep, which measures the same table on a namespace lab."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import scripted_group
from paretopipe.analysis import devices
from paretopipe.analysis.keys import ConfigKey, placement_devices
from paretopipe.errors import UsageError
from paretopipe.predict import subsets
from paretopipe.controller import sweep
from paretopipe.controller import hosts
from paretopipe.search.sweep_space import search_space, trial_options, with_placements_of
from paretopipe.controller.sweep.options import check_placements
from paretopipe.controller.sweep.placements import parse_placements, pass_options

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
#: Each placement's seconds per batch: the second host is the slow one, so a third device helps
#: only after the fast one (1-3-2), and the best pair is 1-2.
SPEED = {"1-2": 0.010, "1-3": 0.012, "1-2-3": 0.013, "1-3-2": 0.009}


def _testbed() -> hosts.Testbed:
    return hosts.Testbed.from_env({"HOSTS": ",".join(HOSTS)})


def test_placements_are_parsed_against_the_testbed_and_bad_ones_refused_in_one_line():
    assert parse_placements("all", 3) == ["1-2", "1-3", "1-2-3", "1-3-2"]
    assert parse_placements(" 1-3-2, 1-2,1-3-2", 3) == ["1-3-2", "1-2"]
    for bad in ("1-1", "2-1", "1-4", "1", "1-x", "1--2"):
        with pytest.raises(UsageError, match=r"is not a placement of this testbed's 3 hosts; give host numbers 1 to 3"):
            parse_placements(bad, 3)
    with pytest.raises(UsageError, match="names none"):
        parse_placements("1-2", 0)
    assert placement_devices("1-3-2") == (0, 2, 1) and placement_devices("in-order") is None


def test_a_placements_pass_runs_its_hosts_in_order_and_its_plans_only():
    opts = sweep.SweepOptions(models=["mobilenetv2"], plans=[(3,), (2, 4)], placements=["1-3", "1-3-2"],
                              testbed=_testbed())
    three = pass_options(opts, "1-3-2")
    assert [h.address for h in three.testbed.hosts] == ["127.0.0.2", "127.0.0.4", "127.0.0.3"]
    assert three.plans == [(2, 4)] and sweep.options.stage_count(three) == 3
    two = pass_options(opts, "1-3")
    assert [h.address for h in two.testbed.hosts] == ["127.0.0.2", "127.0.0.4"] and two.plans == [(3,)]
    assert pass_options(opts, None) is opts
    # Two hosts without a one-cut plan take --splits; three without a plan of three stages are refused.
    assert pass_options(sweep.SweepOptions(models=["m"], testbed=_testbed(), placements=["1-2"]), "1-2").plans is None
    with pytest.raises(UsageError, match=r"--placements 1-2-3: 3 hosts need a plan of 3 stages in --split-blocks"):
        check_placements(sweep.SweepOptions(models=["m"], plans=[(3,)], placements=["1-2-3"], testbed=_testbed()))
    with pytest.raises(UsageError, match=r"plan 2,4 has 3 stages, and no placement of --placements 1-2 has 3 hosts"):
        check_placements(sweep.SweepOptions(models=["m"], plans=[(3,), (2, 4)], placements=["1-2"], testbed=_testbed()))


def _sweep(tmp_path, **extra):
    made_on: list[list[str]] = []
    make = scripted_group.factory(lambda cfg, i: SPEED[cfg["placement"]])

    def on_hosts(sweeper, model, backend):
        made_on.append([h.address for h in sweeper.opts.testbed.hosts])
        return make(sweeper, model, backend)

    opts = sweep.SweepOptions(models=["mobilenetv2"], plans=[(3,), (2, 4)], placements=parse_placements("all", 3),
                              testbed=_testbed(), networks=["lan"], runs=1, batch_size=1, num_batches=3, warmup=1,
                              out=str(tmp_path), session="s", seed=3, drift_every_s=0, **extra)
    return sweep.Sweeper(opts, on_hosts), made_on


def test_a_sweep_over_placements_keys_each_and_the_report_says_what_each_extra_device_buys(tmp_path):
    sweeper, made_on = _sweep(tmp_path, report=True)
    result = sweeper.run()
    assert not result.failed and result.measured == 4
    # One worker group per placement, made on its hosts in its order.
    assert made_on == [HOSTS[:2], [HOSTS[0], HOSTS[2]], HOSTS, [HOSTS[0], HOSTS[2], HOSTS[1]]]
    session = tmp_path / "s"
    assert sorted(p.name for p in (session / "runs").glob("*.json")) == [
        "mobilenetv2_tcp_lan_k2-4_h1-2-3_r0.json", "mobilenetv2_tcp_lan_k2-4_h1-3-2_r0.json",
        "mobilenetv2_tcp_lan_k3_h1-2_r0.json", "mobilenetv2_tcp_lan_k3_h1-3_r0.json"]
    summary = pd.read_csv(session / "summary.csv")
    assert dict(zip(summary["placement"], summary["latency_median_s"])) == pytest.approx(SPEED)
    assert {ConfigKey.of(r).placement for r in summary.to_dict("records")} == set(SPEED)
    stopping = json.loads((session / "session.json").read_text())["groups"]["mobilenetv2/tcp/h1-3-2"]["stopping"]
    assert list(stopping) == ["mobilenetv2_tcp_lan_k2-4_h1-3-2"]
    table = pd.read_csv(session / "report" / "devices.csv")
    latency = table[table["objective"] == "latency"].set_index("devices")
    assert latency.loc[2, "placement"] == "127.0.0.2 -> 127.0.0.3" and latency.loc[2, "cuts"] == "3"
    assert latency.loc[3, "placement"] == "127.0.0.2 -> 127.0.0.4 -> 127.0.0.3" and latency.loc[3, "cuts"] == "2,4"
    assert latency.loc[3, "vs_one_fewer"] == pytest.approx(0.9) and latency.loc[3, "gain"] == "gain"
    throughput = table[table["objective"] == "throughput"].set_index("devices")
    assert throughput.loc[3, "gain"] == "gain" and throughput.loc[3, "vs_one_fewer"] == pytest.approx(10 / 9, rel=0.02)
    assert "what each extra device buys" in (session / "report" / "report.html").read_text()


def test_the_extra_device_that_costs_is_called_a_loss_and_one_number_of_devices_gives_no_table():
    rows = pd.DataFrame([
        {"model": "m", "backend": "tcp", "network": "lan", "batch_size": 1, "split_index": "3", "placement": "1-2",
         "status": "complete", "latency_s": 0.010},
        {"model": "m", "backend": "tcp", "network": "lan", "batch_size": 1, "split_index": "2,4", "placement": "1-2-3",
         "status": "complete", "latency_s": 0.015},
        {"model": "m", "backend": "tcp", "network": "lan", "batch_size": 1, "split_index": "2,4", "placement": "1-3-2",
         "status": "infeasible", "latency_s": 0.001}])
    from paretopipe.analysis.objectives import LATENCY

    table = devices.device_table(rows, [LATENCY], HOSTS)
    assert table.set_index("devices").loc[3, "gain"] == "loss"  # the infeasible one is not a placement's best
    assert table.set_index("devices").loc[3, "vs_one_fewer"] == pytest.approx(1.5)
    assert devices.device_table(rows[:1], [LATENCY], HOSTS).empty


def test_a_search_varies_the_placements_of_its_number_of_stages(tmp_path):
    opts = sweep.SweepOptions(models=["mobilenetv2"], splits="2-5", placements=parse_placements("all", 3),
                              testbed=_testbed(), out=str(tmp_path))
    searched, stages = with_placements_of(opts, 2)
    assert searched.placements == ["1-2", "1-3"] and stages == 2
    space = search_space(searched, 19, 2)
    assert space.dim("placement").choices == ("1-2", "1-3") and space.size() == 4 * 2
    config = space.normalise({"split": 4, "network": "lan", "placement": "1-3"})
    trial = trial_options(searched, space, config, "s")
    assert trial.placements == ["1-3"] and trial.splits == "4"
    with pytest.raises(UsageError, match="a search of --stages 2 runs on 2 hosts"):
        with_placements_of(sweep.SweepOptions(models=["m"], placements=["1-2-3"], testbed=_testbed()), 2)


def test_a_search_over_every_placement_gives_each_a_plan_of_its_own_number_of_stages(tmp_path):
    """Without --stages, placements of two and three hosts are one space: a pair uses the plan's
    first cut, so suggestions that differ only in the cut it leaves unused are one configuration."""
    opts = sweep.SweepOptions(models=["mobilenetv2"], splits="2-5", placements=parse_placements("all", 3),
                              testbed=_testbed(), out=str(tmp_path))
    searched, stages = with_placements_of(opts, None)
    assert searched.placements == ["1-2", "1-3", "1-2-3", "1-3-2"] and stages == 3
    space = search_space(searched, 19, stages)
    assert space.plan == ("cut1", "cut2") and space.length_dim == "placement"
    everything = list(space.configs())
    # 4 positions: a pair's plan is one of 4, a chain of three's one of 10 (cuts in order, may coincide).
    assert len(everything) == space.size() == 2 * 4 + 2 * 10
    pair = [space.normalise({"cut1": 4, "cut2": c, "placement": "1-3"}) for c in (2, 3, 5)]
    assert len(set(pair)) == 1 and space.plan_of(pair[0]) == (4,)
    chain = space.normalise({"cut1": 5, "cut2": 3, "placement": "1-3-2"})
    assert space.plan_of(chain) == (3, 5)
    trial = trial_options(searched, space, pair[0], "s")
    assert trial.plans == [(4,)] and trial.placements == ["1-3"]
    assert pass_options(trial, "1-3").plans == [(4,)]
    assert trial_options(searched, space, chain, "s").plans == [(3, 5)]
    from paretopipe.search.sweep_space import split_label

    assert split_label(space, pair[0]) == "4" and split_label(space, chain) == "3,5"


def test_a_local_session_given_to_validate_is_refused_as_run_on_this_machine():
    row = {"status": "complete", "network": "lan", "prompt_len": 16, "split_index": "3", "ttft_median_s": 0.1,
           "tpot_median_s": 0.01}
    with pytest.raises(UsageError, match="a session ran on this machine, not on hosts; the devices are 127.0.0.2"):
        subsets.measured_generation([([], [row])], HOSTS, "lan", 16)
    placed = subsets.measured_generation([(HOSTS, [{**row, "split_index": "2,4", "placement": "1-3-2"}])], HOSTS,
                                         "lan", 16)
    assert [p.devices for p in placed] == [(0, 2, 1)]
