"""What the sweep reads of a stage group: its report, field by field, and where its processes run."""

from __future__ import annotations

import pytest

from paretopipe.errors import PeerError, UsageError
from paretopipe.controller import hosts
from paretopipe.controller.sweep import SweepOptions
from paretopipe.controller.sweep.group import GroupInfo, placement


def test_a_stage_groups_report_is_read_field_by_field_and_a_malformed_one_is_refused():
    ready = {"event": "ready", "pid": 4242, "model": "mobilenet_v2", "fingerprint": "abc", "num_blocks": 2,
             "block_cuts": ["input", "b1", "output"], "payload_bytes_per_image": [3, 2, 1], "limits": None}
    info = GroupInfo.of(ready)  # a worker's ready event carries its pid too: not part of the report
    assert (info.model, info.num_blocks, info.block_cuts, info.world_size) == ("mobilenet_v2", 2,
                                                                             ["input", "b1", "output"], None)
    with pytest.raises(UsageError, match="num_blocks"):
        GroupInfo.of({**ready, "num_blocks": "2"})
    with pytest.raises(UsageError, match="block_cuts"):
        GroupInfo.of({k: v for k, v in ready.items() if k != "block_cuts"})
    with pytest.raises(PeerError, match="2 block cuts for 2 blocks"):
        GroupInfo.of({**ready, "block_cuts": ["input", "output"]})





def test_placement_gives_each_stage_its_threads_device_and_share_and_the_group_its_cipher():
    opts = SweepOptions(models=["m"], plans=[(3, 9)], threads=2, stage_threads=[1, None], stage_cpu=[0.5, None],
                        stage_devices=["cpu", "cpu", "cuda:0"], num_classes=7, optimizations=False)
    where = placement(opts, "aes-256-gcm")
    assert where.devices == ["cpu", "cpu", "cuda:0"] and where.encrypt == "aes-256-gcm"
    assert where.threads[:3] == [1, 2, 2]  # stage 1's own, then --threads for the rest
    assert where.cpu_shares == [0.5, None] and where.pin is False and where.num_classes == 7
    two = placement(SweepOptions(models=["m"]), "none")
    assert two.devices == ["cpu", "cpu"] and two.testbed == hosts.Testbed()
    remote = hosts.Testbed(hosts=[hosts.Host("127.0.0.2"), hosts.Host("127.0.0.3")])
    assert placement(SweepOptions(models=["m"], testbed=remote), "none").testbed is remote


def test_a_stage_held_to_a_cpu_share_gets_no_more_threads_than_its_share_rounds_up_to():
    """Threads beyond the quota only wait on each other's throttled periods (on a 16-core GPU
    machine, MobileNetV2 under 0.35 of a core took 28 s a batch on 8 threads); threads given
    by flag are kept."""
    where = placement(SweepOptions(models=["m"], stage_cpu=[0.35, 2.5]), "none")
    assert [where.threads_for(j, 2, cores=16) for j in (0, 1)] == [1, 3]
    assert placement(SweepOptions(models=["m"]), "none").threads_for(0, 2, cores=16) == 8
    assert placement(SweepOptions(models=["m"], stage_cpu=[4.0, None]), "none").threads_for(0, 2, cores=4) == 2
    given = placement(SweepOptions(models=["m"], stage_threads=[4, None], stage_cpu=[0.35, None]), "none")
    assert given.threads_for(0, 2, cores=16) == 4
