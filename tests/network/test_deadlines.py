"""Deadlines that follow the link: hand-computed bounds for constant rates, losses and a trace's
slowest stretch (paretopipe.network.deadlines)."""

from __future__ import annotations

import pytest

from paretopipe.network import deadlines, traces
from paretopipe.network.conditions import Direction, NetworkConditions, get_conditions


def test_3g_deadline_covers_the_batch_that_broke_the_fixed_60_s():
    """MobileNetV2 k=2 at batch 8 sends 6,422,528 B; 3G's 768 kbit/s uplink needs 66.9 s for it."""
    three_g = get_conditions("3g")
    up = 6_422_528
    serialise = up * 8 / 768e3
    assert serialise == pytest.approx(66.90, abs=0.01)
    down = 10 * 4 * 8
    per_batch = (serialise + 0.150 + 4 * 0.020) + (down * 8 / 1.6e6 + 0.150 + 4 * 0.020)
    assert deadlines.run_timeout_s(three_g, up, down, in_flight=1) == pytest.approx(60 + 3 * per_batch)
    # Four batches queued ahead of the one awaited wait four times as long.
    assert deadlines.run_timeout_s(three_g, up, down, in_flight=4) == pytest.approx(60 + 12 * per_batch)


def test_compute_and_no_link_keep_the_base():
    assert deadlines.run_timeout_s(None, 10**9, 10**9) == deadlines.BASE_S
    # A stage 100 times slower than native lengthens the deadline through its measured compute.
    assert deadlines.run_timeout_s(None, 0, 0, in_flight=2, compute_s=30.0) == pytest.approx(60 + 3 * 2 * 30)


def test_losses_add_a_round_trip_per_expected_lost_segment():
    lossy = Direction(delay_s=0.05, loss_percent=10.0, rate_bps=8e6)
    nbytes = 1448 * 100  # 100 segments: 10 expected losses, plus one
    expected = nbytes * 8 / 8e6 + 0.05 + 11 * 2 * 0.05
    assert deadlines.transfer_bound_s(lossy, nbytes) == pytest.approx(expected)


def test_a_trace_is_bounded_by_its_slowest_stretch_outage_included(tmp_path):
    """One opportunity a millisecond for 1 s, then 2 s of outage (period 3 s): 10 packets take at
    most the outage plus 10 ms, starting just before it (0.991 s .. 3.000 s + 0.009 s)."""
    path = tmp_path / "outage.mahimahi"
    path.write_text("\n".join(str(t) for t in range(0, 1000)) + "\n3000\n")
    trace = traces.load(path)
    assert len(trace.opportunities_ms) == 1000 and trace.period_ms == 3000
    direction = Direction(trace=str(path))
    ten_packets = 10 * traces.PACKET_BYTES
    assert deadlines.serialise_bound_s(direction, ten_packets) == pytest.approx(3.000 - 0.990)
    # The mean rate (one packet per 3 ms) would have promised 30 ms.
    assert ten_packets * 8 / trace.mean_rate_bps == pytest.approx(0.030)
    conditions = NetworkConditions("outage", up=direction, down=Direction())
    assert deadlines.run_timeout_s(conditions, ten_packets, 0) == pytest.approx(60 + 3 * (3.000 - 0.990))
