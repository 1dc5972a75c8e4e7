"""The per-segment compute tracker: a change is flagged by its coefficient of variation,
re-profiled with its successor and recorded; ours follows a stage's speed on the segments it does
not run, sampled only by spans long enough to show a CPU quota, and probes a stage whose speed no
span sampled. The policies that use it: tests/predict/test_adaptive_policy.py."""

from __future__ import annotations

import pytest

from paretopipe.predict.compute_tracker import PROBE_SPAN_S, PROBE_WEIGHT, ComputeTracker

SEGMENTS = 6


def _tracker(**kw) -> ComputeTracker:
    return ComputeTracker([[0.01] * SEGMENTS, [0.01] * SEGMENTS], **kw)


def test_a_steady_stage_is_never_reprofiled_and_keeps_its_profile():
    t = _tracker()
    for seq in range(40):
        t.observe(seq, 0, 0, [0.01 * (1 + 0.02 * ((seq + j) % 3)) for j in range(3)])
    assert t.due() == [] and t.events == [] and t.reprofiles == 0
    assert t.estimate(0, 0) == pytest.approx(0.0102, rel=0.03)


def test_a_slowdown_is_flagged_by_its_cv_and_reprofiled_with_its_successor():
    t = _tracker()
    for seq in range(10):
        t.observe(seq, 0, 0, [0.01, 0.01, 0.01])
    for seq in range(10, 14):  # stage 1 throttles: 2.5x
        t.observe(seq, 0, 0, [0.025, 0.025, 0.025])
    due = t.due()
    # Segments 0..2 vary past 15%; each brings its successor, so segment 3 (not run here) too.
    assert sorted(r.segment for r in due) == [0, 1, 2, 3] and all(r.stage == 0 for r in due)
    assert due[0].why.startswith("cv ") and "> 0.15" in due[0].why
    assert any(r.why.startswith("after segment 2") for r in due if r.segment == 3)
    # Stage 1 re-times them (the driver does it between batches, as one chain from segment 0).
    t.reprofiled(14, 0, 0, [0.025] * 4, [r.why for r in sorted(due, key=lambda r: r.segment)])
    assert t.estimate(0, 0) == t.estimate(0, 3) == pytest.approx(0.025)  # the estimate jumps
    ev = t.events[-1]
    assert ev["seq"] == 14 and ev["stage"] == "stage1" and ev["segment"] == 3
    assert 0.01 < ev["old_s"] < 0.025 and ev["new_s"] == pytest.approx(0.025)  # was the stage's speed times 0.01
    # Not flagged again before its window has refilled.
    for seq in range(15, 20):
        t.observe(seq, 0, 0, [0.025, 0.025, 0.025])
    assert t.due() == []


def test_stage_2_reprofiles_from_its_newest_batches():
    t = _tracker()
    for seq in range(10):
        t.observe(seq, 1, 2, [0.01] * 4)
    for seq in range(10, 13):
        t.observe(seq, 1, 2, [0.03] * 4)
    assert t.due() == []  # nothing for stage 1 to re-time: stage 2 already did it
    assert {e["stage"] for e in t.events} == {"stage2"} and {e["how"] for e in t.events} == {"stage 2's newest batch"}
    assert t.estimate(1, 2) == pytest.approx(0.03)


def test_ours_scales_the_segments_a_stage_does_not_run_and_sciots_does_not():
    ours, sciot = _tracker(), _tracker(speed_ratio=False)
    for t in (ours, sciot):
        for seq in range(30):
            t.observe(seq, 0, 0, [0.03, 0.03, 0.03])  # 3x slower than profiled, three segments run
    assert ours.ratio(0) == pytest.approx(3, rel=0.05)
    assert ours.estimate(0, 5) == pytest.approx(0.03, rel=0.05)  # never run: the stage's speed
    assert sciot.estimate(0, 5) == 0.01  # never run: the profile, until a local batch refreshes it


def test_a_span_shorter_than_a_quota_period_leaves_the_speed_and_a_longer_one_moves_it():
    t = _tracker()
    for seq in range(50):  # a 10 ms tail, twice as fast, every batch: what a quota's burst shows
        t.observe(seq, 1, 5, [0.005])
    assert t.ratio(1) == 1
    t.observe(50, 1, 3, [0.02] * 3)  # 30 ms, twice as slow: one sample at weight alpha
    assert PROBE_SPAN_S <= 0.03 and t.ratio(1) == pytest.approx(2 ** 0.2)
    small = ComputeTracker([[0.001] * SEGMENTS, [0.001] * SEGMENTS])  # 6 ms in all: half of it is enough
    small.observe(0, 1, 3, [0.002] * 3)
    assert small.ratio(1) == pytest.approx(2 ** (0.2 * 0.003 / PROBE_SPAN_S))
    small.observe(1, 1, 4, [0.002] * 2)
    assert small.ratio(1) == pytest.approx(2 ** (0.2 * 0.003 / PROBE_SPAN_S))


def test_a_stage_1_that_ran_nothing_is_probed_over_one_quota_period():
    t = _tracker()
    due = t.due(probe_after_s=0.0)
    assert [r.segment for r in due] == [0, 1] and "compute probe" in due[0].why  # 2 x 10 ms = PROBE_SPAN_S
    assert t.due(probe_after_s=None) == []


def test_a_stage_that_runs_only_short_spans_is_probed_and_one_that_runs_long_spans_is_not():
    """Stage 1 at an early split runs a few ms a batch: no sample of its speed, so without a probe a
    throttle's estimate would stay through the recovery (the throttled lab test's CI failure: split
    3 kept for a whole full-speed phase at a ratio of 3.4)."""
    t = _tracker()
    t.reprofiled(0, 0, 0, [0.04, 0.04], ["throttled"], probe=True)  # 4x slow: the throttle's estimate
    slow = t.ratio(0)
    assert slow > 2 and t.due(probe_after_s=0.5) == []  # the probe just sampled it
    for seq in range(1, 40):
        t.observe(seq, 0, 0, [0.01])  # 10 ms a batch at full speed: below a quota period, no sample
    assert t.ratio(0) == slow and [r.segment for r in t.due(probe_after_s=0.0)] == [0, 1]
    t.reprofiled(40, 0, 0, [0.01, 0.01], ["compute probe"], probe=True)
    assert t.ratio(0) == pytest.approx(slow ** (1 - PROBE_WEIGHT))  # the probe moves it
    long = _tracker()
    long.observe(0, 0, 0, [0.01] * 3)  # 30 ms: a sample, so nothing is due within the interval
    assert long.due(probe_after_s=60.0) == [] and long.probe_due(1, 60.0) > 0  # stage 2: never sampled


def test_device_profiles_from_another_machine_are_followed_relative_to_the_runs_start():
    t = ComputeTracker([[0.1] * SEGMENTS, [0.1] * SEGMENTS], relative=True)
    for seq in range(10):  # this machine is 10x faster than the profile: that is the baseline
        t.observe(seq, 0, 0, [0.01, 0.01])
    assert t.estimate(0, 0) == pytest.approx(0.1) and t.ratio(0) == 1
    for seq in range(10, 40):  # then it halves its speed
        t.observe(seq, 0, 0, [0.02, 0.02])
    assert t.estimate(0, 0) == pytest.approx(0.2, rel=0.05) and t.ratio(0) == pytest.approx(2, rel=0.1)
