"""Compute traces: the CSV and its refusals, the shipped traces, the stepping controller on a real
cgroup with a real busy process, and a sweep whose records say which share each stage had when."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paretopipe.compute import cpushare, cputrace
from paretopipe.errors import UsageError
from paretopipe.network.conditions import NetworkConditions, conditions_from_values

from test_cpushare import _real_cgroups

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = cputrace.shipped_dir()
NO_CGROUPS = _real_cgroups()


def _trace(tmp_path: Path, body: str) -> str:
    path = tmp_path / "t.csv"
    path.write_text(body)
    return str(path)


def test_a_trace_is_a_repeating_step_function_of_shares():
    t = cputrace.parse(["time_s,cpu_share", "# a comment", "0,1.0", "20,0.4", "80,1"], "x")
    assert t.period_s == 140  # the last row holds as long as the step before it
    assert [t.share_at(s) for s in (0, 19.9, 20, 79.9, 80, 139.9, 140, 160)] == [1, 1, 0.4, 0.4, 1, 1, 1, 0.4]
    assert t.next_change_after(0) == 20 and t.next_change_after(20) == 80 and t.next_change_after(85) == 140
    assert t.next_change_after(150) == 160  # the second period, unwrapped


@pytest.mark.parametrize("body, match", [
    ("time_s,cpu_share\n0,1\n5,0\n", "line 3: CPU share 0 must be > 0"),
    ("time_s,cpu_share\n0,1\n5,-0.5\n", "line 3: CPU share -0.5 must be > 0"),
    ("time_s,cpu_share\n0,1\n5,0.5\n3,1\n", "line 4: time 3 s does not come after 5 s"),
    ("time_s,cpu_share\n0,1\n5,5,1\n", "line 3: expected time_s,cpu_share"),
    ("time_s,cpu_share\n2,1\n", "the first row must be at time 0"),
    ("time_s,cpu_share\n", "has no rows"),
    ("time_s,cpu_share\n0,fast\n", "not a number"),
    ("time_s,cpu_share\n0,1\n1,999\n", "out of range"),
])
def test_a_bad_trace_is_refused_in_one_line_naming_the_fault(tmp_path, body, match):
    with pytest.raises(UsageError, match=match):
        cputrace.load(_trace(tmp_path, body))


def test_stage_names_are_checked(tmp_path):
    good = _trace(tmp_path, "time_s,cpu_share\n0,1\n1,0.5\n")
    assert cputrace.parse_stage_traces(f"stage1={good}") == {"stage1": good}
    assert cputrace.parse_stage_traces("stage2=pi4-throttle")["stage2"] == str(SHIPPED / "pi4-throttle.csv")
    for text, match in ((good, "give STAGE=FILE"), (f"={good}", "give STAGE=FILE"),
                        (f"stage3={good}", "unknown stage 'stage3'; valid: stage1, stage2"),
                        (f"stage1={good},stage1={good}", "stage1 is given twice"),
                        ("stage1=/nonexistent.csv", "compute trace not found")):
        with pytest.raises(UsageError, match=match):
            cputrace.parse_stage_traces(text)


def test_the_shipped_traces_say_what_their_comments_say():
    pi = cputrace.load(SHIPPED / "pi4-throttle.csv")
    assert pi.share_at(10) == 1.0 and pi.share_at(20) == pi.share_at(79.9) == 0.4 and pi.share_at(80) == 1.0
    assert pi.period_s == 140  # a minute at 40%, then recovered
    noisy = cputrace.load(SHIPPED / "noisy-neighbour.csv")
    assert min(noisy.shares) == 0.2 and noisy.period_s == 75 and noisy.share_at(0) == 1.0


def test_a_network_may_bring_compute_traces(tmp_path):
    cond = conditions_from_values("pi-hot", {"delay": "5ms", "cpu_trace_stage1": "pi4-throttle"})
    assert cond.cpu_traces == (("stage1", str(SHIPPED / "pi4-throttle.csv")),)
    assert NetworkConditions.from_dict(cond.to_dict()) == cond
    assert conditions_from_values("pi-hot", cond.to_values()) == cond
    with pytest.raises(UsageError, match=r"network 'bad' \(cpu_trace_stage1\): compute trace not found"):
        conditions_from_values("bad", {"cpu_trace_stage1": "nope.csv"})


def test_a_run_command_naming_a_foreign_group_is_refused():
    with pytest.raises(UsageError, match="not a group ParetoPipe made"):
        cputrace.StageTrace.of({"stage": "stage1", "cgroup": "/sys/fs/cgroup/cpu", "trace": "x", "offset_s": None})
    with pytest.raises(UsageError, match="offset_s"):
        cputrace.StageTrace.of({"stage": "stage1", "cgroup": "/x/paretopipe-a-1", "trace": "x", "offset_s": "soon"})


def test_partition1_refuses_a_trace_for_another_stage_before_building_anything(tmp_path):
    good = _trace(tmp_path, "time_s,cpu_share\n0,1\n1,0.5\n")
    proc = subprocess.run([sys.executable, "partition1.py", "--model", "mobilenetv2", "--split", "4",
                           "--stage-cpu-trace", f"stage2={good}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --stage-cpu-trace: unknown stage 'stage2'; valid: stage1"]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.alone
@pytest.mark.root
@pytest.mark.skipif(NO_CGROUPS is not None, reason=f"no usable cgroup cpu controller: {NO_CGROUPS}")
def test_the_controller_steps_a_real_groups_quota_and_the_process_gets_that_share(tmp_path):
    """A busy process pinned to one core, in a group the controller steps 1 -> 0.25 -> 1: the
    kernel holds the quota the log says, and the process gets about that share of the core."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {0})
        applied = cpushare.limit(busy.pid, 1.0, "tracetest")
        trace = cputrace.load(_trace(tmp_path, "time_s,cpu_share\n0,1\n1,0.25\n3,1\n"))
        ctl = cputrace.CpuTraceController("stage1", trace, applied, offset_s=0.0).start()
        quota = Path(applied["cgroup"], "cpu.cfs_quota_us" if applied["cgroup_version"] == 1 else "cpu.max")
        try:
            time.sleep(1.4)  # inside the 0.25 step
            assert quota.read_text().split()[0] == "2500"
            c0, t0 = _cpu_seconds(busy.pid), time.monotonic()
            time.sleep(1.2)
            slow = (_cpu_seconds(busy.pid) - c0) / (time.monotonic() - t0)
            time.sleep(0.6)  # past the step back to 1 at 3 s
            assert quota.read_text().split()[0] == "10000"
            c0, t0 = _cpu_seconds(busy.pid), time.monotonic()
            time.sleep(1.0)
            full = (_cpu_seconds(busy.pid) - c0) / (time.monotonic() - t0)
        finally:
            ctl.stop()
            cpushare.release(applied, busy.pid)
    finally:
        busy.kill()
        busy.wait()
    assert 0.15 < slow < 0.35 and full > 0.6, (slow, full)
    summary = ctl.summary()
    assert [(s["trace_time_s"], s["cpu_share"]) for s in summary["steps"][:3]] == [(0.0, 1.0), (1.0, 0.25), (3.0, 1.0)]
    assert summary["error"] is None and summary["late_max_s"] < 0.5
    assert not Path(applied["cgroup"]).exists()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(NO_CGROUPS is not None, reason=f"no usable cgroup cpu controller: {NO_CGROUPS}")
def test_a_sweep_replays_a_compute_trace_from_a_seeded_offset_and_records_it(tmp_path):
    """Every run of a configuration's round r replays the trace from the same seeded offset; the
    record's stage-1 manifest holds each step, and the batches slow down while the share is low."""
    # 0.1, not a milder share: with the other tests' processes on both cores, a share of 1 may
    # already get less than half a core, so a mild cut would not slow the batches measurably.
    # A period of 1.5 s, shorter than the run wherever the seeded offset starts it, so every run
    # meets both shares.
    trace = _trace(tmp_path, "time_s,cpu_share\n0,1\n0.5,0.1\n1,1\n")
    proc = subprocess.run([sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4,19",
                           "--runs", "1", "--batch-size", "1", "--num-batches", "100", "--threads", "1",
                           "--stage-cpu-trace", f"stage1={trace}", "--out", str(tmp_path / "out"),
                           "--session", "s", "--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "s" / "runs").glob("*.json"))]
    assert len(records) == 2
    offsets = set()
    for rec in records:
        (replay,) = rec["manifest"]["stages"][0]["cpu_traces"]
        offsets.add(replay["offset_s"])
        assert replay["stage"] == "stage1" and replay["error"] is None
        steps = replay["steps"]
        assert steps[0]["t_s"] == 0 and {s["cpu_share"] for s in steps} == {1.0, 0.1}
        # The share the log says held at each batch's start matches how long stage 1 took: the
        # k = 19 run (all of the model on stage 1) is slower under 0.1 than under 1.
        if rec["config"]["split_index"] == 19:
            def share(b):
                return [s["cpu_share"] for s in steps if s["t_s"] <= b["start_s"]][-1]
            batches = [b for b in rec["batches"] if not b["warmup"]]
            low = [b["stage1_compute_s"] for b in batches if share(b) == 0.1]
            high = [b["stage1_compute_s"] for b in batches if share(b) == 1.0]
            assert low and high and sorted(low)[len(low) // 2] > 1.5 * sorted(high)[len(high) // 2]
    assert len(offsets) == 1  # the same stretch of the trace for both configurations
    assert records[0]["manifest"]["stages"][0]["limits"]["cgroup"].split("/")[-1].startswith("paretopipe-stage1")
