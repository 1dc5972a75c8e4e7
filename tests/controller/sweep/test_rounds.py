"""Order, repetitions and drift: seeded interleaved rounds, the precision rule and the drift
monitor, on scripted numbers (the sweep that applies them is tested in test_sweep.py against a
scripted stage group), and the Pi's throttling flags."""

from __future__ import annotations

import os
import time

import pytest

from paretopipe.controller.sweep import rounds

CONFIGS = [(n, k) for n in ("lan", "wifi", "lte") for k in range(6)]


def test_rounds_are_seeded_complete_and_differ():
    r0 = rounds.round_order(CONFIGS, 0, "m/tcp", 0, False)
    assert sorted(r0) == sorted(CONFIGS)  # every configuration once per round
    assert r0 == rounds.round_order(CONFIGS, 0, "m/tcp", 0, False)  # reproducible
    assert r0 != rounds.round_order(CONFIGS, 0, "m/tcp", 1, False)  # a new order each round
    assert r0 != rounds.round_order(CONFIGS, 1, "m/tcp", 0, False)  # and per seed
    assert r0 != sorted(r0)  # interleaved: neighbouring splits are not measured back to back
    grouped = rounds.round_order(CONFIGS, 0, "m/tcp", 0, True)
    networks = [n for n, _ in grouped]
    # With tc, each network's qdiscs are applied once per round: its splits stay together.
    assert sum(1 for a, b in zip(networks, networks[1:]) if a != b) == 2
    assert sorted(grouped) == sorted(CONFIGS)


def test_precision_rule():
    p = rounds.ConfigProgress()
    for lat, thr in ((0.100, 50.0), (0.101, 50.2), (0.099, 49.9)):
        p.add({"latency_median_s": lat, "throughput_imgs_per_s": thr})
        p.attempts += 1
    assert p.decide(3, 0.05, 5) == rounds.PRECISE
    assert p.halfwidths[0] < 0.05 and p.halfwidths[1] < 0.05
    noisy = rounds.ConfigProgress()
    for lat in (0.10, 0.15, 0.07):
        noisy.add({"latency_median_s": lat, "throughput_imgs_per_s": 50.0})
        noisy.attempts += 1
    assert noisy.decide(3, 0.05, 5) is None  # keep measuring
    noisy.attempts = 5
    assert noisy.decide(3, 0.05, 5) == rounds.BUDGET
    plain = rounds.ConfigProgress(attempts=2)
    assert plain.decide(3, None, 3) is None
    plain.attempts = 3
    assert plain.decide(3, None, 3) == rounds.RUNS


def test_drift_monitor_thresholds():
    d = rounds.DriftMonitor(every_s=10.0)
    assert d.needs_baseline("lan") and d.due(0.0)
    d.set_baseline("lan", [{"throughput_imgs_per_s": t} for t in (100.0, 104.0, 98.0)], now=1.0)
    assert not d.due(5.0) and d.due(11.0)
    assert not d.suspect("lan", {"latency_median_s": 0.02, "throughput_imgs_per_s": 95.0})
    assert d.suspect("lan", {"latency_median_s": 0.03, "throughput_imgs_per_s": 70.0})
    # A check is the median of its runs: one slow moment among three is no drift.
    ok = d.check("lan", [{"latency_median_s": 0.02, "throughput_imgs_per_s": t} for t in (70.0, 95.0, 99.0)], now=12.0)
    assert not ok.drift and ok.threshold == pytest.approx(0.12)  # 2 x the baseline's 6% range
    d.since = [(("lan", 3), 1, "k03_r1")]
    slow = d.check("lan", [{"latency_median_s": 0.03, "throughput_imgs_per_s": 70.0}], now=23.0)
    assert slow.drift and slow.change == pytest.approx(0.30) and slow.runs_since == ["k03_r1"]
    assert d.since == []
    # The next check at the same slow level: the machine's new speed; the baseline moves to it and
    # the runs since stand. A later check is judged against the new level.
    d.since = [(("lan", 5), 1, "k05_r1")]
    held = d.check("lan", [{"latency_median_s": 0.03, "throughput_imgs_per_s": 72.0}], now=34.0)
    assert not held.drift and held.rebaselined and held.baseline_throughput == pytest.approx(100.0)
    assert d.baselines["lan"][0] == pytest.approx(71.0)
    assert not d.check("lan", [{"latency_median_s": 0.03, "throughput_imgs_per_s": 70.0}], now=45.0).drift
    # Two drifts to different levels are two drifts.
    assert d.check("lan", [{"latency_median_s": 0.02, "throughput_imgs_per_s": 95.0}], now=56.0).drift
    assert d.check("lan", [{"latency_median_s": 0.05, "throughput_imgs_per_s": 40.0}], now=67.0).drift


def test_throttling_is_read_from_a_pi_and_flagged(tmp_path, monkeypatch):
    """vcgencmd exists only on a Raspberry Pi: a stand-in prints a real get_throttled answer
    (0x50005: under-voltage and throttled now, and since boot)."""
    from paretopipe import sysmon

    fake = tmp_path / "bin" / "vcgencmd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n[ \"$1\" = get_throttled ] && echo throttled=0x50005\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with sysmon.SystemMonitor(interval_s=0.05) as mon:
        time.sleep(0.12)
    out = mon.summary()
    assert out["throttled"] is True and out["throttle_flags"] == "0x50005"
    fake.write_text("#!/bin/sh\necho throttled=0x50000\n")  # happened since boot, not now
    with sysmon.SystemMonitor(interval_s=0.05) as mon:
        pass
    assert mon.summary()["throttled"] is False
