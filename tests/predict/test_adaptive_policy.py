"""The adaptive split's arithmetic, no runtime: the link estimate follows a step either way
equally fast and takes the RTT as the minimum sample; the chooser offloads on a fast link, keeps
the work local on a slow one and does not flap; ours moves work off a throttled stage 1 and back,
and follows a busy stage 2 while it runs nothing; SCIoT's rule has no hysteresis and forces local
batches at its rate. The runtime end to end is tests/controller/test_adaptive.py; the per-segment
compute estimates are tests/predict/test_compute_tracker.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paretopipe.predict import adaptive_policy
from paretopipe.predict.adaptive_policy import (LARGE_FRAME_BYTES, AdaptivePolicy, LinkEstimate, LinkEstimator,
                                                SciotPolicy, SplitChooser, VarianceSettings)
from paretopipe.predict.device_profile import synthetic_profile
from tcp_helpers import block_profiles

SEGMENTS = 6


# -- the link estimate and the chooser --------------------------------------------------------------
def test_estimator_follows_a_tenfold_step_both_ways_equally_fast():
    def steps_to_reach(start_rate, end_rate):
        est = LinkEstimator(alpha=0.5)
        est.observe(40, 0.002)
        nbytes = 100_000
        for _ in range(20):
            est.observe(nbytes, 0.002 + nbytes * 8 / start_rate)
        for i in range(1, 50):
            est.observe(nbytes, 0.002 + nbytes * 8 / end_rate)
            if abs(math.log(est.estimate.goodput_bps / end_rate)) < math.log(1.25):
                return i
        return None

    down, up = steps_to_reach(40e6, 4e6), steps_to_reach(4e6, 40e6)
    assert down is not None and down == up  # log-space smoothing: symmetric
    est = LinkEstimator()
    for rtt in (0.012, 0.003, 0.009):  # scheduling delay only ever adds: the minimum is the RTT
        est.observe(40, rtt)
    assert est.estimate.rtt_s == pytest.approx(0.003)
    est.observe(LARGE_FRAME_BYTES * 4, 0.003 + LARGE_FRAME_BYTES * 4 * 8 / 20e6)
    assert est.estimate.goodput_bps == pytest.approx(20e6, rel=1e-6)


def test_chooser_offloads_on_a_fast_link_keeps_work_local_on_a_slow_one_and_does_not_flap():
    chooser = SplitChooser(block_profiles("mobilenetv2", 0.005, 0.0005), 1, range(0, 20))
    fast = LinkEstimate(rtt_s=0.002, s_per_byte=8 / 40e6)
    slow = LinkEstimate(rtt_s=0.002, s_per_byte=8 / 1e6)
    k_fast = chooser.choose(None, fast).split
    assert k_fast < 19 and chooser.choose(None, slow).split == 19
    # From the fast split, a slow link must be seen twice (patience) before it switches.
    first = chooser.choose(k_fast, slow)
    assert not first.switched and first.split == k_fast
    second = chooser.choose(k_fast, slow)
    assert second.switched and second.split == 19
    # An estimate that wobbles around the point where two splits cost the same never switches.
    lo = None
    for rate in np.geomspace(1e6, 40e6, 200):
        picks = chooser.choose(None, LinkEstimate(rtt_s=0.002, s_per_byte=8 / rate)).split
        if picks != 19 and lo is None:
            lo = rate
    wobble = [LinkEstimate(rtt_s=0.002, s_per_byte=8 / (lo * f)) for f in (0.97, 1.03) * 20]
    current = chooser.choose(None, wobble[0]).split
    assert all(not chooser.choose(current, e).switched for e in wobble)
    throughput = SplitChooser(block_profiles("mobilenetv2", 0.005, 0.0005), 1, range(0, 20), objective="throughput")
    assert throughput.choose(None, fast).predicted[k_fast] > 0


# -- the two policies ------------------------------------------------------------------------------
def _policy(cls, **kw) -> AdaptivePolicy:
    bpi = [600_000] + [100_000] * (SEGMENTS - 1) + [4_000]
    segments = [f"k{k}" for k in range(SEGMENTS + 1)]
    profiles = [synthetic_profile([0.01] * SEGMENTS, bpi), synthetic_profile([0.014] * SEGMENTS, bpi)]
    cut_of = {k: f"k{k}" for k in range(SEGMENTS + 1)}
    policy = cls(cut_of, list(range(SEGMENTS + 1)), SEGMENTS, lambda meta: profiles, batch_size=1,
                 segments=segments, variance=VarianceSettings(), seed=3, **kw)
    policy.start({})
    policy.estimator.estimate = LinkEstimate(rtt_s=0.001, s_per_byte=8 / 1e9, samples=10)  # a 1 Gbit/s LAN
    return policy


def _run(policy: AdaptivePolicy, batches: int, stage1_s: float, stage2_s: float, first_seq: int = 0) -> list:
    """Feed ``batches`` decisions, each stage observing its segments at the given per-segment time."""
    chosen = []
    current = [policy.cut_of[SEGMENTS]]
    for seq in range(first_seq, first_seq + batches):
        cuts, fields = policy.cuts_for(seq, current)
        k = int(cuts[0][1:])
        chosen.append(k)
        policy.observe_compute(seq, 0, 0, [stage1_s] * k)
        policy.observe_compute(seq, 1, k, [stage2_s] * (SEGMENTS - k))
        due = policy.reprofiles_due()
        for segment, why in due:
            policy.reprofiled(seq, segment, [stage1_s], [why])
        for first, count in policy.stage2_probes_due():
            policy.stage2_probed(seq, first, [stage2_s] * count)
        current = cuts
    return chosen


def test_ours_moves_work_off_a_throttled_stage_1_and_back_after_it_recovers(monkeypatch):
    monkeypatch.setattr(adaptive_policy, "COMPUTE_PROBE_INTERVAL_S", 0.0)  # a probe per batch: no clock here
    policy = _policy(AdaptivePolicy)
    fast = _run(policy, 30, 0.01, 0.014)
    assert fast[-1] == SEGMENTS  # stage 1 is the faster device: all of it there
    throttled = _run(policy, 40, 0.025, 0.014, 30)
    assert throttled[-1] == 0 and throttled.index(0) <= 15
    recovered = _run(policy, 60, 0.01, 0.014, 70)
    assert recovered[-1] == SEGMENTS
    summary = policy.summary()
    assert summary["policy"] == "adaptive" and summary["compute"]["reprofiles"] > 0
    assert summary["compute"]["reprofile_events"][0]["why"]


def test_sciots_rule_has_no_hysteresis_and_forces_local_batches_at_its_rate():
    policy = _policy(SciotPolicy, local_probability=0.25)
    chosen = _run(policy, 400, 0.025, 0.014)  # stage 1 slow throughout: SCIoT offloads, except when forced
    forced = policy.summary()["forced_local"]
    assert 70 <= forced <= 130  # 25% of 400, seeded
    assert chosen.count(SEGMENTS) >= forced and chosen[-50:].count(0) >= 25
    assert policy.summary()["policy"] == "sciot" and policy.summary()["local_probability"] == 0.25


def test_ours_follows_a_busy_stage_2_even_while_it_runs_nothing(monkeypatch):
    """Stage 1 at half a server's speed offloads; a neighbour takes stage 2's core, so the work comes
    home (k = K, stage 2 runs no segment); only stage 2's compute probes show that it is free again."""
    monkeypatch.setattr(adaptive_policy, "COMPUTE_PROBE_INTERVAL_S", 0.0)
    policy = _policy(AdaptivePolicy)
    assert _run(policy, 30, 0.02, 0.01)[-1] == 0          # the server is faster: all of it there
    assert _run(policy, 40, 0.02, 0.06, 30)[-1] == SEGMENTS  # its core taken: all of it here
    back = _run(policy, 40, 0.02, 0.01, 70)
    assert back[-1] == 0 and back.index(0) <= 10
    hows = {e["how"] for e in policy.summary()["compute"]["reprofile_events"]}
    assert "compute probe on stage 2" in hows
