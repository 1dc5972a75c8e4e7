"""The sweeper's loop (controller.sweep.sweeper) against a scripted stage group: no process and no
model, so each mechanism is seen alone: the planned order of rounds, stopping when precise or at the
budget, drift set aside and measured again, failures retried once, resume, and a full disk."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from conftest import PYTHON, ROOT
from paretopipe.controller import sweep
from paretopipe.errors import PeerError


def _scripted(tmp_path, script, groups=None, **opts):
    import scripted_group

    base = dict(models=["mobilenetv2"], splits="2,4,6,8", networks=["lan"], runs=2, batch_size=1, num_batches=4,
                warmup=1, out=str(tmp_path), session="s", report=False, seed=7)
    base.update(opts)
    return sweep.Sweeper(sweep.SweepOptions(**base), scripted_group.factory(script, groups))


def _speed(k: int) -> float:
    return 0.010 + 0.001 * k


def test_scripted_rounds_run_in_the_planned_order_and_stop_when_precise(tmp_path):
    from paretopipe.controller.sweep import rounds

    sweeper = _scripted(tmp_path, lambda cfg, i: _speed(cfg["split_index"]), precision=0.05, max_runs=4,
                        drift_every_s=0)
    result = sweeper.run()
    assert not result.failed and result.measured == 8
    meta = json.loads((tmp_path / "s" / "session.json").read_text())
    group = meta["groups"]["mobilenetv2/tcp"]
    assert group["order"] == "random" and group["seed"] == 7 and group["precision"] == 0.05
    expected = [f"mobilenetv2_tcp_lan_k{k:02d}_r0" for _, k in
                rounds.round_order([("lan", k) for k in (2, 4, 6, 8)], 7, "mobilenetv2/tcp", 0, False)]
    assert group["executed"][:4] == expected
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    # Identical runs are as precise as can be: each configuration stops at the minimum of 2 runs.
    assert set(summary["stop_reason"]) == {"precise"} and set(summary["runs"]) == {2}
    assert summary.set_index("split_index")["latency_median_s"].to_dict() == pytest.approx(
        {k: _speed(k) for k in (2, 4, 6, 8)})


def test_scripted_sequential_order_is_the_anchors(tmp_path):
    sweeper = _scripted(tmp_path, lambda cfg, i: _speed(cfg["split_index"]), splits="3,7", order="sequential")
    sweeper.run()
    meta = json.loads((tmp_path / "s" / "session.json").read_text())
    assert meta["groups"]["mobilenetv2/tcp"]["executed"] == [
        "mobilenetv2_tcp_lan_k03_r0", "mobilenetv2_tcp_lan_k03_r1", "mobilenetv2_tcp_lan_k07_r0",
        "mobilenetv2_tcp_lan_k07_r1"]
    assert not (tmp_path / "s" / "reference").exists()  # no drift checks in sequential order
    assert set(pd.read_csv(tmp_path / "s" / "summary.csv")["stop_reason"]) == {"runs"}


def test_scripted_noise_keeps_measuring_until_the_budget(tmp_path):
    noisy = {0: 1.0, 1: 1.6, 2: 0.7, 3: 1.3}

    def script(cfg, i):
        return _speed(cfg["split_index"]) * (noisy[cfg["run"] % 4] if cfg["split_index"] == 4 else 1.0)

    _scripted(tmp_path, script, precision=0.05, max_runs=4, drift_every_s=0).run()
    summary = pd.read_csv(tmp_path / "s" / "summary.csv").set_index("split_index")
    assert summary.loc[4, "stop_reason"] == "budget" and summary.loc[4, "runs"] == 4
    assert (summary.drop(4)["stop_reason"] == "precise").all() and (summary.drop(4)["runs"] == 2).all()


def test_scripted_drift_is_caught_set_aside_and_measured_again(tmp_path):
    """The machine slows by half after the baseline and stays slow: the first check that sees it
    confirms drift, the runs since move to drifted/ and are measured again, and the next check
    finds the same level and takes it as the new baseline (the re-measurement is bounded)."""
    slow_from = 6  # calls 0-2 are the reference's baseline; a few sweep runs go at full speed

    def script(cfg, i):
        return _speed(cfg["split_index"]) * (1.5 if i >= slow_from else 1.0)

    groups: list = []
    sweeper = _scripted(tmp_path, script, groups, drift_every_s=1e-9, report=True)
    result = sweeper.run()
    assert not result.failed
    meta = json.loads((tmp_path / "s" / "session.json").read_text())
    group = meta["groups"]["mobilenetv2/tcp"]
    checks = group["drift_checks"]
    # Round 0 in the seeded order: the check after k=4 and k=8 (full speed) is clean; the one after
    # k=2 (the first slow run) sees the reference a third down, confirmed by its median of three.
    assert not checks[0]["drift"] and checks[0]["change"] == 0
    assert checks[1]["drift"] and checks[1]["change"] == pytest.approx(1 / 3)
    assert checks[1]["runs_since"] == ["mobilenetv2_tcp_lan_k02_r0"]
    # The next check finds the same slow level: the machine's new speed, not drift.
    assert checks[2]["rebaselined"] and not checks[2]["drift"]
    assert checks[3]["baseline_throughput"] == pytest.approx(checks[1]["throughput"])
    assert not any(c["drift"] for c in checks[2:])
    assert sorted(p.name for p in (tmp_path / "s" / "drifted").glob("*.json")) == ["mobilenetv2_tcp_lan_k02_r0.json"]
    assert group["stopping"]["mobilenetv2_tcp_lan_k02"]["remeasured_after_drift"] == 1
    assert group["executed"].count("mobilenetv2_tcp_lan_k02_r0") == 2  # measured again
    runs = pd.read_csv(tmp_path / "s" / "runs.csv")
    assert not runs["run_key"].str.contains("_ref").any()
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert set(summary["split_index"]) == {2, 4, 6, 8} and (summary["runs"] >= 2).all()
    assert sum(s["remeasured_after_drift"] for s in group["stopping"].values()) == 1
    proc = subprocess.run([PYTHON, "-m", "paretopipe", "report", str(tmp_path / "s")], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "drift: mobilenetv2 tcp lan" in proc.stdout


def test_scripted_failures_are_retried_once_and_recorded(tmp_path):
    """A run that fails once is started afresh and measured; one that fails twice is a failure the
    sweep reports (exit 1 from the command), while every other configuration completes."""
    failed_once: set = set()

    def script(cfg, i):
        key = cfg["run_key"]
        if cfg["split_index"] == 4 and key not in failed_once:
            failed_once.add(key)
            return PeerError("stage2: peer closed the connection")
        if cfg["split_index"] == 6:
            return PeerError("timed out waiting for a frame header")
        return _speed(cfg["split_index"])

    groups: list = []
    result = _scripted(tmp_path, script, groups, runs=1, drift_every_s=0).run()
    assert {p.config_key for p in result.failed} == {"mobilenetv2_tcp_lan_k06"}
    failures = pd.read_csv(tmp_path / "s" / "failures.csv")
    assert sorted(failures["run_key"]) == ["mobilenetv2_tcp_lan_k04_r0", "mobilenetv2_tcp_lan_k06_r0",
                                           "mobilenetv2_tcp_lan_k06_r0"]
    assert sorted(pd.read_csv(tmp_path / "s" / "runs.csv")["split_index"]) == [2, 4, 8]
    assert len(groups) >= 1 + 3  # each failed attempt started the stages afresh


def test_scripted_interrupt_then_resume_measures_only_what_is_missing(tmp_path):
    def interrupted(cfg, i):
        return KeyboardInterrupt() if i == 3 else _speed(cfg["split_index"])

    with pytest.raises(KeyboardInterrupt):
        _scripted(tmp_path, interrupted, runs=1, drift_every_s=0).run()
    done = {p.stem for p in (tmp_path / "s" / "runs").glob("*.json")}
    assert len(done) == 3
    groups: list = []
    _scripted(tmp_path, lambda cfg, i: _speed(cfg["split_index"]), groups, runs=1, drift_every_s=0,
              resume=True).run()
    measured = {c["run_key"] for g in groups for c in g.calls}
    assert len(measured) == 1 and not measured & done  # only the missing run
    assert len(pd.read_csv(tmp_path / "s" / "runs.csv")) == 4


def test_scripted_full_disk_stops_the_sweep_with_one_line_and_keeps_what_was_written(tmp_path, monkeypatch):
    import errno

    from paretopipe.analysis.session import Session
    from paretopipe.controller.sweep import DiskFullError

    real = Session.write_run
    writes = []

    def write_run(self, key, record):
        writes.append(key)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, key, record)

    monkeypatch.setattr(Session, "write_run", write_run)
    with pytest.raises(DiskFullError, match=r"disk full: cannot write .*--resume"):
        _scripted(tmp_path, lambda cfg, i: _speed(cfg["split_index"]), runs=1, drift_every_s=0).run()
    kept = list((tmp_path / "s" / "runs").glob("*.json"))
    assert len(kept) == 2 and all(json.loads(p.read_text())["status"] == "complete" for p in kept)
