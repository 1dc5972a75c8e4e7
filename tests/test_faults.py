"""Faults as a treatment (paretopipe.faults): the --fault forms, refused in one line when malformed,
and the figures of what a fault cost a run, computed from batch records whose story is known."""

from __future__ import annotations

import pytest

from paretopipe import faults
from paretopipe.errors import UsageError


def test_the_fault_forms_and_their_refusals():
    assert faults.parse_fault("none") is None
    kill = faults.parse_fault("stage2:kill@20+2")
    assert (kill.target, kill.kind, kill.at_batch, kill.seconds, kill.label) == ("stage2", "kill", 20, 2.0,
                                                                                 "stage2:kill@20+2")
    assert faults.parse_faults("none, link:down@5+0.5,stage2:freeze@3+1") == \
        ["none", "link:down@5+0.5", "stage2:freeze@3+1"]
    for bad, says in (("stage2:melt@1+1", "valid none"), ("link:kill@1+1", "valid none"),
                      ("stage2:kill@-1+1", "valid none"), ("stage2:kill@1+0", r"S seconds in \(0, 600\]"),
                      ("stage2:kill@1", "valid none"), ("none,none", "named twice"), ("", "at least one")):
        with pytest.raises(UsageError, match=says):
            faults.parse_faults(bad)


def _batch(seq, start, latency, local=False, gave_up=None):
    b = {"seq": seq, "start_s": start, "end_s": start + latency, "latency_s": latency}
    if local:
        b.update(served_locally=True, gave_up_s=gave_up if gave_up is not None else start + latency)
    return b


def test_a_kill_detected_at_once_served_locally_and_recovered_after_a_restart():
    # 10 ms batches; stage 2 dies as batch 5 starts (t = 0.05), stage 1 sees EOF 2 ms later and
    # serves batches 5..259 itself (5 ms each), stage 2 is back for batch 260.
    batches = [_batch(s, s * 0.01, 0.01) for s in range(5)]
    t = 0.05
    batches.append(_batch(5, t, 0.007, local=True, gave_up=t + 0.002))
    t += 0.007
    for s in range(6, 260):
        batches.append(_batch(s, t, 0.005, local=True))
        t += 0.005
    batches += [_batch(260, t, 0.01), _batch(261, t + 0.01, 0.01)]
    got = faults.outage_figures(batches, faults.parse_fault("stage2:kill@5+1"), 0.05, 100)
    assert got["fault_detect_s"] == pytest.approx(0.002)
    assert got["fault_served_locally"] == 255
    assert got["fault_recover_s"] == pytest.approx(t + 0.01 - 0.05)
    assert got["fault_lost"] == 0 and got["fault_duplicated"] == 0 and got["fault_extra_batches"] == 162
    # The window holds batch 5..260: 254 at 5 ms, one at 7 ms and one at 10 ms, against 10 ms before.
    assert got["fault_cost_s"] == pytest.approx(254 * 0.005 + 0.007 + 0.01 - 256 * 0.01)
    # p99 by nearest rank: the 254th of the window's 256 latencies
    assert got["fault_window_p99_s"] == pytest.approx(0.005)


def test_a_freeze_shorter_than_the_deadline_is_never_detected_and_a_lost_batch_is_counted():
    batches = [_batch(s, s * 0.01, 0.01) for s in range(5)] + [_batch(5, 0.05, 0.5)] + \
        [_batch(s, 0.55 + (s - 6) * 0.01, 0.01) for s in range(6, 10)]
    got = faults.outage_figures(batches, faults.parse_fault("stage2:freeze@5+0.4"), 0.05, 10)
    assert got["fault_detect_s"] is None and got["fault_served_locally"] == 0
    assert got["fault_recover_s"] == pytest.approx(0.56 - 0.05)  # the first batch begun after the freeze
    assert got["fault_window_p99_s"] == pytest.approx(0.5)
    unfinished = batches[:-1] + [{"seq": 9, "start_s": 0.6, "latency_s": None}]
    assert faults.outage_figures(unfinished, faults.parse_fault("stage2:freeze@5+0.4"), 0.05, 11)["fault_lost"] == 2
    never = faults.outage_figures(batches[:3], faults.parse_fault("stage2:kill@5+1"), None, 10)
    assert never["fault_start_s"] is None and never["fault_lost"] == 7 and never["fault_cost_s"] is None
