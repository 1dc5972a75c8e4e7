"""The split policy the data source's driver consults: a static run's is its own cuts whatever the
driver sees, and the adaptive policy (no torch) turns the driver's observations into a choice, with
cuts of several tensors among its candidates weighed by the bytes they carry in all."""

from __future__ import annotations

import pytest

from paretopipe.predict.adaptive_policy import (LARGE_FRAME_BYTES, PROBE_BYTES, PROBE_INTERVAL_S, AdaptivePolicy,
                                         SplitChooser, self_profile)
from paretopipe.transport.policy import StaticPolicy

FINE = "a+b"   # a cut where two tensors cross, between block splits 1 and 2
# Boundaries: input (k0), block split 1, the two-tensor cut, block split 2, output (k3). The
# two-tensor cut carries less in all than either block split beside it (a skip and a narrow branch).
NAMES = ["k0", "k1", FINE, "k2", "k3"]
BLOCKS = {0: 0, 1: 1, 2: 3, 3: 4}
BYTES = [600_000, 400_000, 150_000, 300_000, 40]


def _profiles(edge_s: float = 0.03, server_s: float = 0.001):
    return [self_profile("mobilenet_v2", 1, {"segment_compute_s": [s] * 4, "whole_model_s": 4 * s,
                                             "call_overhead_s": 0.0}, BYTES, role, NAMES, BLOCKS)
            for role, s in (("stage1", edge_s), ("stage2", server_s))]


def _policy(candidates=(0, 1, FINE, 2, 3)) -> AdaptivePolicy:
    cut_of = {0: "input", 1: "b1", FINE: FINE, 2: "b2", 3: "output"}
    return AdaptivePolicy(cut_of, list(candidates), 3, lambda meta: _profiles(), batch_size=1)


def test_a_static_policy_keeps_the_runs_cuts_whatever_it_observes():
    policy = StaticPolicy(["b1", "b2"])
    policy.start({"profile": "ignored"})
    for seq, current in enumerate((["b1", "b2"], None, ["other"])):
        policy.observe(10_000_000, 30.0, "late")
        assert policy.cuts_for(seq, current) == (["b1", "b2"], {})
    assert not policy.adaptive and list(policy.startup_probes()) == [] and list(policy.probes_due(1e9)) == []


def test_the_chooser_weighs_a_cut_of_several_tensors_by_their_summed_bytes():
    chooser = SplitChooser(_profiles(), 1, [0, 1, FINE, 2, 3])
    assert chooser.candidates == [0, 1, FINE, 2, 3]   # graph order across block splits and named cuts
    from paretopipe.predict.adaptive_policy import LinkEstimate

    slowish = LinkEstimate(rtt_s=0.002, s_per_byte=8 / 50e6)
    picked = chooser.choose(None, slowish)
    assert picked.split == FINE, picked.predicted
    # What tips it is the bytes: with the fine cut's bytes those of split 1 it would lose to split 1.
    heavy = [600_000, 400_000, 400_000, 300_000, 40]
    same_bytes = [self_profile("mobilenet_v2", 1, {"segment_compute_s": [s] * 4, "whole_model_s": 4 * s,
                                                   "call_overhead_s": 0.0}, heavy, role, NAMES, BLOCKS)
                  for role, s in (("stage1", 0.03), ("stage2", 0.001))]
    assert SplitChooser(same_bytes, 1, [0, 1, FINE, 2, 3]).choose(None, slowish).split != FINE
    with pytest.raises(Exception, match="not a boundary of these profiles"):
        SplitChooser(_profiles(), 1, [1, "c+d"])


def test_the_adaptive_policy_serves_locally_without_a_next_stage_and_chooses_freely_on_a_new_one():
    policy = _policy()
    cuts, fields = policy.cuts_for(0, None)
    assert cuts == ["output"] and fields["split_k"] == 3 and "predicted_s" not in fields
    policy.start({})
    for _ in range(3):
        policy.observe(40, 0.002, "ping")
    policy.observe(PROBE_BYTES, 0.002 + PROBE_BYTES * 8 / 50e6, "probe")
    cuts, fields = policy.cuts_for(1, ["output"])   # the first choice on a connection is free
    assert cuts == [FINE] and fields["split_k"] is None and fields["split_candidate"] == 2
    assert fields["predicted_s"] > 0 and fields["estimate_goodput_mbit_per_s"] == pytest.approx(50, rel=0.01)
    # Later choices pass the hysteresis: one fast sample does not move it.
    policy.observe(LARGE_FRAME_BYTES * 100, 0.002 + LARGE_FRAME_BYTES * 100 * 8 / 5000e6, "result")
    assert policy.cuts_for(2, [FINE])[0] == [FINE]
    assert policy.summary()["candidates"] == [0, 1, FINE, 2, 3]


def test_the_adaptive_policy_asks_for_a_probe_when_its_view_of_the_link_is_stale():
    policy = _policy()
    startup = list(policy.startup_probes())
    assert startup.count(0) >= 1 and startup.count(PROBE_BYTES) >= 1
    now = policy.last_rate_sample
    assert list(policy.probes_due(now)) == []
    assert sorted(policy.probes_due(now + PROBE_INTERVAL_S)) == [0, PROBE_BYTES]
    policy.observe(LARGE_FRAME_BYTES, 0.01, "result")      # a large frame shows the rate
    assert list(policy.probes_due(policy.last_rate_sample + PROBE_INTERVAL_S / 2)) == []
    policy.observe(LARGE_FRAME_BYTES, 5.0, "late")        # a missed deadline is no fresh sample
    assert policy.last_rate_sample < policy.last_rtt_sample + PROBE_INTERVAL_S
