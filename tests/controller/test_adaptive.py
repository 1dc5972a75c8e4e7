"""The adaptive split's runtime end to end (its arithmetic: tests/predict/test_adaptive_policy.py),
with real processes, real sockets and an emulated trace: it follows a step in the link with outputs
equal to the unsplit model, and it keeps serving every batch when stage 2 freezes, dies and returns."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from paretopipe.predict.adaptive_policy import (PROBE_ALPHA, PROBE_BYTES, PROBE_INTERVAL_S, LinkEstimate, LinkEstimator,
                                                SplitChooser)
from paretopipe.analysis.adaptive_comparison import trace_time_at_clock_zero
import tcp_helpers as cli
from tcp_helpers import (assert_logits_equal_unsplit, block_profiles, builder, free_port, stage2_freezes_dies_and_returns,
                         start)

MODEL = "mobilenetv2"
# The step test's link: STEP_S fast (FAST_MBIT), then SLOW_S slow (SLOW_MBIT), repeating. While it
# keeps the work local, the runtime learns that the link got faster only from its next rate probe,
# up to PROBE_INTERVAL_S later; one probe moves the estimate past the switch point, and the switch
# waits for the chooser's patience (2 batches: test_one_rate_probe_after_a_step_up_is_enough).
# SETTLE_S allows that plus 1 s for the probe and those batches on a loaded machine. A slower link
# shows only in the offloaded batches that cross it, each 1.2 to 2.5 s at SLOW_MBIT: a slow phase's
# batch is judged once two batches begun after the step have ended (and SETTLE_S has passed), and
# the slow phase is the longer so that some are left to judge (4 s was not: a run under the
# parallel pass switched 3.75 s after one step and not at all before the next).
STEP_S = 4.0
SLOW_S = 6.0
# 2 Mbit/s, not 3: k = 8 beats local at 3 Mbit/s once stage 1 measures 2.5 times slower against
# stage 2 than the profiles say (3.7 at 2 Mbit/s). A loaded machine moved the ratio that far, the
# runtime followed it, and a run under -n 2 was left with no batch of a slow phase to judge.
SLOW_MBIT = 2
# 80 Mbit/s, not 40, and a server 20 times faster than the edge device, not 10: a loaded machine
# that timed stage 1's first batches slowly measures it up to 2.6 times faster later, and at 40
# Mbit/s that made keeping the work local a close call (within the chooser's 10% margin) for half
# of a fast phase's batches in one CI run.
FAST_MBIT = 80
STAGE1_BLOCK_S, STAGE2_BLOCK_S = 0.005, 0.00025
SETTLE_S = PROBE_INTERVAL_S + 1.0


def _profiles(stage1_block_s: float, stage2_block_s: float):
    return block_profiles(MODEL, stage1_block_s, stage2_block_s)


# -- arithmetic the step test rests on (the rest: tests/predict/test_adaptive_policy.py) ------------
def test_one_rate_probe_after_a_step_up_is_enough_to_offload_again():
    """The step test's bound rests on this: after a long slow (SLOW_MBIT) spell kept local, one rate
    probe on the FAST_MBIT link, plus the chooser's patience, brings the work back to the server."""
    chooser = SplitChooser(_profiles(STAGE1_BLOCK_S, STAGE2_BLOCK_S), 1, range(0, 20))
    est = LinkEstimator()
    est.observe(40, 0.002)
    for _ in range(30):
        est.observe(PROBE_BYTES, 0.002 + PROBE_BYTES * 8 / (SLOW_MBIT * 1e6), PROBE_ALPHA)
    assert chooser.choose(None, est.estimate).split == 19
    est.observe(PROBE_BYTES, 0.002 + PROBE_BYTES * 8 / (FAST_MBIT * 1e6), PROBE_ALPHA)
    first, second = chooser.choose(19, est.estimate), chooser.choose(19, est.estimate)
    assert not first.switched and second.switched and second.split < 19


# -- the runtime, end to end -----------------------------------------------------------------------
def _write_profiles(tmp_path) -> str:
    paths = []
    for p in _profiles(STAGE1_BLOCK_S, STAGE2_BLOCK_S):
        path = tmp_path / f"{p.doc['role']}.json"
        path.write_text(json.dumps(p.doc))
        paths.append(str(path))
    return ",".join(paths)


def _record(folder):
    (path,) = folder.glob("*.json")
    return json.loads(path.read_text())


def _link_decides(batch: dict, rate_bps: float) -> bool:
    """Whether the phase's link alone settles this batch's choice: offloaded on the fast link,
    local on the slow one, by more than the chooser's margin (a closer call keeps whichever split
    the batch before had: hysteresis), for the compute the runtime had measured by then and for
    that compute 25% either way, and at 70% of the link's rate (the goodput the runtime measures
    under the frames' overhead: 59 to 71 Mbit/s of 80 on a loaded machine). The runtime also
    follows compute (a loaded machine slows stage 1 against its first batches, or speeds it up), so
    a batch whose measured compute puts it near a crossover says nothing about the link and is not
    judged."""
    slower = batch["compute_ratio_stage1"] / batch["compute_ratio_stage2"]
    link = LinkEstimate(rtt_s=0.002, s_per_byte=8 / (0.7 * rate_bps))
    wanted_local = rate_bps < 10e6
    for factor in (0.8, 1.25):
        chooser = SplitChooser(_profiles(STAGE1_BLOCK_S * slower * factor, STAGE2_BLOCK_S), 1, range(0, 20))
        predicted = chooser.choose(None, link).predicted
        offloaded = min(s for k, s in predicted.items() if k != 19)
        winner, loser = (predicted[19], offloaded) if wanted_local else (offloaded, predicted[19])
        if not winner < loser * (1 - chooser.margin):
            return False
    return True


def _step_phases(batches: list[dict], offset: float, period: float):
    """A batch's phase where the runtime can know it: "fast" from SETTLE_S after the step up,
    "slow" from SETTLE_S after the step down and once two batches begun after it have ended;
    None before that."""
    known_slow: dict[int, float] = {}  # a slow phase (its period's number) -> when the runtime can know
    for n in range(int((offset + batches[-1]["start_s"]) // period) + 1):
        step = n * period + STEP_S - offset  # the step down, on the batches' clock
        after = [b["end_s"] for b in batches if b["start_s"] >= step][:2]
        known_slow[n] = max(step + SETTLE_S, after[-1]) if len(after) == 2 else math.inf

    def phase(b: dict) -> str | None:
        n, t = divmod(offset + b["start_s"], period)
        if SETTLE_S <= t < STEP_S:
            return "fast"
        return "slow" if t >= STEP_S and b["start_s"] >= known_slow[int(n)] else None
    return phase


@pytest.mark.slow
def test_adaptive_run_follows_a_step_from_fast_to_slow_and_back_with_exact_outputs(tmp_path):
    trace = tmp_path / "step.csv"
    period = STEP_S + SLOW_S  # a CSV trace's last row holds as long as the step before it, then it repeats
    trace.write_text(f"time_s,rate_mbit\n0,{FAST_MBIT}\n{STEP_S:g},{SLOW_MBIT}\n{STEP_S + SLOW_S / 2:g},{SLOW_MBIT}\n")
    port = str(free_port())
    # The run must span two periods of the trace (20 s) whatever this machine's speed: at least as
    # many batches as the whole model runs in that time on one thread (300 spanned 5.5 s, not even
    # one period, on today's machine, and a run that ended local showed no return to the server).
    total = min(3000, max(300, math.ceil(2 * period / _whole_model_s())))
    common = ["--model", MODEL, "--split", "adaptive", "--port", port, "--threads", "1", "--connect-timeout", "90"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", str(total - 2),
               "--warmup", "2", "--trace", str(trace), "--device-profiles", _write_profiles(tmp_path),
               "--out", str(tmp_path / "s1"), "--save-outputs", str(tmp_path / "out.npz"))
    s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
    assert s1.wait(240) == 0, s1.stderr.read()
    assert s2.wait(60) == 0, s2.stderr.read()
    rec = _record(tmp_path / "s1")
    assert rec["status"] == "complete" and rec["config"]["split_index"] == "adaptive"
    batches = rec["batches"]
    assert len(batches) == total and all(b["latency_s"] > 0 for b in batches)
    ks = [b["split_k"] for b in batches]
    # Each batch carries its split and the estimates behind the choice.
    assert all(b["estimate_goodput_mbit_per_s"] > 0 and b["estimate_rtt_ms"] >= 0 for b in batches)
    for prev, b in zip(batches, batches[1:]):
        assert b["switched"] == (b["split_k"] != prev["split_k"])
    # The choice follows the trace: offloaded while fast, kept local (k = K) while slow, once the
    # runtime can know (see SETTLE_S).
    trace_meta = rec["manifest"]["link"]["trace_up"]
    offset = trace_time_at_clock_zero(trace_meta)
    assert offset >= trace_meta["offset_s"]  # the replay starts with the link, before the startup probes
    phase = _step_phases(batches, offset, period)

    fast = [b["split_k"] for b in batches if phase(b) == "fast" and _link_decides(b, FAST_MBIT * 1e6)]
    slow = [b["split_k"] for b in batches if phase(b) == "slow" and _link_decides(b, SLOW_MBIT * 1e6)]
    assert fast and slow
    assert sum(k < 19 for k in fast) >= 0.8 * len(fast), (fast, slow)
    assert sum(k == 19 for k in slow) >= 0.8 * len(slow), (fast, slow)
    # ...through at least one full fast -> slow -> fast cycle.
    first_local = ks.index(19, ks.index(next(k for k in ks if k < 19)))
    assert any(k < 19 for k in ks[first_local:])
    assert rec["summary"]["split_switches"] >= 2
    assert_logits_equal_unsplit(tmp_path / "out.npz", MODEL, total)


@pytest.mark.slow
def test_an_adaptive_run_on_onnx_runtime_computes_every_segment_there_with_the_unsplit_outputs(tmp_path):
    """Both stages on ONNX Runtime: each runs its part as a chain of exported segments (timed one
    by one, as the policy needs), and the logits equal the unsplit torch model's within the
    engine's tolerance, whichever split each batch took."""
    port = str(free_port())
    total = 24
    common = ["--model", MODEL, "--split", "adaptive", "--port", port, "--threads", "1", "--connect-timeout", "120",
              "--engine", "onnxruntime"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", str(total),
               "--warmup", "0", "--device-profiles", _write_profiles(tmp_path), "--out", str(tmp_path / "s1"),
               "--save-outputs", str(tmp_path / "out.npz"))
    s2 = start("partition2.py", *common[:-2], "--out", str(tmp_path / "s2"))  # stage 1 tells it the engine
    assert s1.wait(300) == 0, s1.stderr.read()
    assert s2.wait(60) == 0, s2.stderr.read()
    rec = _record(tmp_path / "s1")
    assert rec["status"] == "complete" and len(rec["batches"]) == total
    accounts = [stage["engine"] for stage in rec["manifest"]["stages"]]
    assert [a["engine"] for a in accounts] == ["onnxruntime", "onnxruntime"]
    checked = [a["max_rel_error"] for a in accounts if "max_rel_error" in a]  # a stage that ran a segment
    assert checked and max(checked) < 1e-4
    assert_logits_equal_unsplit(tmp_path / "out.npz", MODEL, total, atol=1e-4)


@pytest.mark.slow
def test_fallback_serves_every_batch_when_stage2_freezes_dies_and_returns(tmp_path):
    port = str(free_port())
    # Stage 1 is held while the new stage 2 starts and a 20 ms link caps the batches stage 2 serves,
    # so the run reaches the return within about 200 batches on any machine: 110 here
    # (tests/transport/test_fallback.py).
    total = 300
    common = ["--model", MODEL, "--split", "adaptive", "--port", port, "--threads", "1", "--connect-timeout", "90"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", str(total),
               "--warmup", "0", "--deadline-ms", "300", "--delay", "20ms", "--device-profiles", _write_profiles(tmp_path),
               "--out", str(tmp_path / "s1"), "--save-outputs", str(tmp_path / "out.npz"))
    s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
    s2b = stage2_freezes_dies_and_returns(s1, s2, common, tmp_path / "s2b", "adaptive: run", 1.5, 1.0)
    assert s1.wait(300) == 0, s1.stderr.read()
    assert s2b.wait(60) == 0, s2b.stderr.read()
    rec = _record(tmp_path / "s1")
    batches = rec["batches"]
    assert rec["status"] == "complete" and len(batches) == total
    assert all(b.get("latency_s") is not None for b in batches)
    adaptive = rec["manifest"]["stages"][0]["adaptive"]
    assert adaptive["deadline_misses"] >= 1 and adaptive["peer_losses"] >= 1 and adaptive["reconnects"] >= 1
    assert adaptive["late_results_dropped"] >= 1
    local = [b for b in batches if b["served_locally"]]
    assert len(local) == adaptive["served_locally"] == rec["summary"]["batches_served_locally"] >= 2
    assert all(b["local_compute_s"] > 0 for b in local)
    assert any(b.get("deadline_missed") for b in local)
    back = next(e["seq"] for e in adaptive["events"] if e["event"] == "reconnected")
    assert any(not b["served_locally"] for b in batches[back:])   # remote again once stage 2 returned
    assert_logits_equal_unsplit(tmp_path / "out.npz", MODEL, total)


@pytest.mark.slow
def test_sweep_runs_adaptive_beside_static_splits_and_reports_the_comparison(tmp_path):
    import pandas as pd

    from conftest import PYTHON, ROOT

    trace = ROOT / "paretopipe" / "network" / "traces" / "step.csv"
    # 30 batches: the span all three runs covered must hold measured batches of each (with 8, a
    # run whose warm-up outlasted another split's whole run under the parallel pass's load had
    # none in it, and the comparison fell back, as it should, to the median over batches).
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", MODEL, "--splits", "8,19,adaptive",
                    "--trace", str(trace), "--batch-size", "1", "--num-batches", "30", "--warmup", "1",
                    "--deadline-ms", "60000",
                    "--runs", "1", "--local", "--drift-every", "0", "--out", str(tmp_path), "--session", "s"], timeout=600)
    assert done.returncode == 0, done.stderr
    session = tmp_path / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert sorted(runs["split_index"].astype(str)) == ["19", "8", "adaptive"]
    assert set(runs["network"]) == {"trace-step"}   # --trace alone sweeps the trace only
    summary = pd.read_csv(session / "summary.csv")
    row = summary[summary["split_index"].astype(str) == "adaptive"].iloc[0]
    assert row["runs"] == 1 and row["latency_median_s"] > 0
    rec = json.loads((session / runs[runs["split_index"].astype(str) == "adaptive"].iloc[0]["json"]).read_text())
    assert rec["config"]["split_index"] == "adaptive" and rec["config"]["adaptive_split"]["candidates"] == [8, 19]
    assert {b["split_k"] for b in rec["batches"]} <= {8, 19}
    assert rec["summary"]["batches_served_locally"] == 0
    # --deadline-ms holds the static runs to the same deadline, with the same fallback counted.
    for j in runs[runs["split_index"].astype(str) != "adaptive"]["json"]:
        static = json.loads((session / j).read_text())
        assert static["config"]["deadline_s"] == 60 and static["summary"]["batches_served_locally"] == 0
        assert static["manifest"]["stages"][0]["fallback"]["served_locally"] == 0
    assert rec["manifest"]["stages"][0]["adaptive"]["self_profiles"]["stage2"]["segment_compute_s"]
    # Static and adaptive met the same stretch of the trace (run 0's seeded offset).
    offsets = {json.loads((session / j).read_text())["manifest"]["link"]["trace_up"]["offset_s"] for j in runs["json"]}
    assert len(offsets) == 1
    table = pd.read_csv(session / "report" / "adaptive.csv")
    assert set(table["role"]) == {"adaptive", "best static", "static"}
    verdict = pd.read_csv(session / "report" / "adaptive_verdicts.csv").iloc[0]
    # Compared by the time-weighted median over the span all three runs covered (the records are here).
    assert verdict["compared_by"] == "time-weighted median over the common span"
    span = dict(zip(table["split_index"].astype(str), table["latency_span_median_s"]))
    best = min(span["8"], span["19"])
    assert verdict["best_static_latency_span_median_s"] == pytest.approx(best)
    assert verdict["adaptive_over_best_latency"] == pytest.approx(span["adaptive"] / best)
    assert str(verdict["adaptive_started_at"]) in {"8", "19"}
    assert (session / "report" / "adaptive_mobilenet_v2_trace-step.png").stat().st_size > 10_000
    assert "adaptive time-weighted median" in done.stdout


@pytest.mark.slow
def test_adaptive_run_switches_to_a_cut_of_two_tensors_named_among_its_candidates(tmp_path):
    """A candidate named by cut: both stages self-profile at its boundary, stage 1 moves stage 2
    there with SWITCH (from the block split it starts at), two tensors cross in every frame, and
    the outputs equal the unsplit model."""
    fine = "features_2_conv_3+features_3_conv_3"
    port = str(free_port())
    total = 12
    common = ["--model", MODEL, "--split", "adaptive", "--port", port, "--threads", "1", "--connect-timeout", "90"]
    s1 = start("partition1.py", *common, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", str(total),
               "--warmup", "0", "--candidates", fine, "--out", str(tmp_path / "s1"),
               "--save-outputs", str(tmp_path / "out.npz"))
    s2 = start("partition2.py", *common, "--out", str(tmp_path / "s2"))
    assert s1.wait(240) == 0, s1.stderr.read()
    assert s2.wait(60) == 0, s2.stderr.read()
    assert f"splits used {fine}" in s1.stdout.read()
    rec = _record(tmp_path / "s1")
    adaptive = rec["manifest"]["stages"][0]["adaptive"]
    assert rec["status"] == "complete" and adaptive["candidates"] == [fine] and rec["config"]["adaptive_split"]["candidates"] == [fine]
    assert all(b["split_k"] is None and b["split_candidate"] == 0 and not b["served_locally"] for b in rec["batches"])
    part = builder(MODEL).partitioner
    assert part.cut(fine).width == 2
    assert {b["payload_bytes"] for b in rec["batches"]} == {part.payload_nbytes(fine, 1)}
    assert rec["batches"][0]["switched"] and adaptive["switches"] == 1
    assert rec["manifest"]["stages"][1]["adaptive"]["switches_applied"] == 1
    # Both self-profiles were timed at the same boundaries: the block cuts and the named one.
    profiles = adaptive["self_profiles"]
    assert len(profiles["stage1"]["segment_compute_s"]) == len(profiles["stage2"]["segment_compute_s"]) == \
        part.num_blocks + 1
    assert_logits_equal_unsplit(tmp_path / "out.npz", MODEL, total)


def test_an_unknown_candidate_cut_is_refused_in_one_line_before_anything_starts(tmp_path):
    done = cli.run([cli.PYTHON, "partition1.py", "--model", MODEL, "--split", "adaptive", "--port", str(free_port()),
                    "--host", "127.0.0.1", "--candidates", "4,nosuch+cut", "--connect-timeout", "1"], timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: adaptive candidate 'nosuch+cut' is not a cut of mobilenet_v2; python -m paretopipe.split "
        "--model mobilenet_v2 --list --fine names them"]


# -- when the device changes ----------------------------------------------------------------------
def _phase_batches(rec: dict, trace_rows: list[tuple[float, float]], period_s: float,
                   settle_s: dict[float, float]) -> dict[float, list[dict]]:
    """Each measured batch by the share its stage 1 had, judged from ``settle_s[share]`` after the
    step to that share (the trace repeats: a row that keeps the share is no step)."""
    offset = rec["manifest"]["stages"][0]["cpu_traces"][0]["offset_s"]
    steps = [(t, share) for i, (t, share) in enumerate(trace_rows) if share != trace_rows[i - 1][1]]
    out: dict[float, list] = {}
    for b in rec["batches"]:
        if b["warmup"]:
            continue
        t = (offset + b["start_s"]) % period_s
        since, share = min(((t - start) % period_s, s) for start, s in steps)
        if since >= settle_s[share]:
            out.setdefault(share, []).append(b)
    return out


def _whole_model_s() -> float:
    """The whole model's median time for one image on one thread here (a full core)."""
    import time

    import torch

    from paretopipe.transport.inputs import synthetic_batch

    model, x, threads = builder(MODEL).model, synthetic_batch(0, 1, 224), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(x)
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.root
def test_both_policies_move_work_off_a_throttled_stage_1_and_back_with_every_reprofile_recorded(tmp_path):
    """Stage 1 (a full core) throttles to 25% for 4 s of every 10 (a Pi 4's throttle, time-compressed
    and deepened) while stage 2 holds 60% of one: local wins at full speed, offloading while
    throttled. Both policies follow it on the same trace; ours's record lists its re-profiles beside
    the switches.

    A batch is judged from 1.5 s after the step to 25% and from 4 s after the step back. Over seven
    runs here both policies had moved off within 1.2 s of the step to 25%. SCIoT was back within
    0.9 s of the step back, ours within 0.1 to 2.9 s: at an early split stage 1's span is too short
    to sample its speed, so ours learns the recovery from compute probes, one a second, each
    weighing 0.7, and three bring a 4x slowdown's estimate within the chooser's 10% margin.

    The margins are wide on purpose. Under a 10 ms CFS period a short batch's median time is not
    its share's: 40% measured 1.9x a full core, not 2.5x, and 70% 1.3x. At 40% against 70% SCIoT's
    rule saw only 1.45x between its two choices, and a CI run whose stage 2 measured slow for a
    moment kept everything local: with no hysteresis and no compute probe, the stage-2 times it
    saw last stay until it runs those segments again (its documented rule). 25% against 60%
    gives about 1.5x for local at full speed and 2x for offloading while throttled.

    While throttled, "off stage 1" means stage 1 keeps at most half of the model's compute (by its
    own profile) on average over the judged batches, not k = 0. Under a quota the early splits tie:
    k = 0, 2 and 3 each measured 19 ms a batch here, and both policies move among them. Which
    partial split wins also depends on how a 10 ms quota period cuts a short span: k = 5 was
    predicted at 21 ms and measured 28 ms. A real device throttles its clock, so that quantisation
    is this emulation's, not a choice to test. It cuts each segment's time unevenly too (one takes
    a period's wait, the next none), and ours keeps the segments it runs by their own times: in one
    run of twenty it held k = 15 for 1.5 s after the step and k = 10 (52%) for 2 s more, its
    estimate of stage 1 at 3.7 to 3.9 times its profile, so 41% of its judged batches kept more
    than half; their mean was 0.29 (0.06 to 0.35 over twenty runs).

    At full speed, "back" means stage 1 keeps more of the model than while throttled, and SCIoT at
    least half of it, not k = 18 or 19: the later splits tie there too. Over three runs here local
    measured 14.1 ms a batch and k = 15, 16 and 17 14.4 to 14.7 (k = 0: 19.1), inside the chooser's
    10% margin, so a run may sit at k = 17 for seconds (a CI run kept 61% of its full-speed batches
    below k = 18). Ours need not keep half: once stage 1 is fast again, stage 2's tail fits inside
    its 60% quota's 10 ms period and runs at a full core's speed, and ours measures that (its
    stage-2 ratio read 0.55 to 0.91 over twenty runs here), so local and the middle splits tie. A CI
    run and a fresh clone's kept k = 8 and k = 5 (46% and 34%) for most full-speed batches, and one
    run here k = 8 and 12 with stage 1's estimate at 1.00.
    SCIoT keeps stage 2's profiled times for the segments it offloads (its rule), so it sees stage 2
    at 60% and goes local. What both must show is that they saw the recovery: stage 1's estimated
    speed against its profile, at least 1.5 while throttled and at most 1.3 at full speed (twenty
    runs here: 1.87 to 3.69, and 0.91 to 1.07)."""
    from paretopipe.compute import cpushare

    try:
        cpushare.check_writable()
    except Exception as exc:  # noqa: BLE001 - the reason is the skip's message
        pytest.skip(f"no writable cgroup cpu controller: {exc}")
    rows, period_s = [(0.0, 1.0), (2.0, 0.25), (6.0, 1.0)], 10.0
    trace = tmp_path / "throttle.csv"
    trace.write_text("time_s,cpu_share\n" + "".join(f"{t:g},{s:g}\n" for t, s in rows))
    # Each run must span the trace's period whatever this machine's speed: at least as many batches
    # as the whole model runs, on one thread at full speed, in the period and 0.7 s (a faster
    # machine, more batches; a run's batch takes longer than the model alone, so the run spans
    # more: 1.7 times the period here). The floor, 300 batches, is about 3.5 s of them here.
    batches = min(5000, max(300, math.ceil((period_s + 0.7) / _whole_model_s())))
    # No drift checks: their baseline is three more runs of the reference, each as long as a run
    # (77 s of this test's 160), and nothing here reads them.
    done = cli.run([cli.PYTHON, "automated_split_tester.py", "--model", MODEL, "--splits", "adaptive,sciot",
                    "--runs", "1", "--batch-size", "1", "--num-batches", str(batches), "--threads", "1",
                    "--stage-cpu", "1,0.6", "--stage-cpu-trace", f"stage1={trace}", "--drift-every", "0",
                    "--out", str(tmp_path / "out"), "--session", "s", "--no-report"], timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "out" / "s" / "runs"
    for policy in ("adaptive", "sciot"):
        rec = json.loads((runs / f"mobilenetv2_tcp_lan_k{policy}_r0.json").read_text())
        phases = _phase_batches(rec, rows, period_s, settle_s={0.25: 1.5, 1.0: 4.0})
        throttled, full = ([b["split_k"] for b in phases[share]] for share in (0.25, 1.0))
        adaptive = rec["manifest"]["stages"][0]["adaptive"]
        # Stage 1's speed against its profile as the policy estimated it, per phase.
        ratio = {share: statistics.median(b["compute_ratio_stage1"] for b in batches)
                 for share, batches in phases.items()}
        why = (policy, "stage 1's median estimated slowdown per share", ratio, "throttled", throttled, "full", full)
        assert ratio[0.25] >= 1.5 and ratio[1.0] <= 1.3, why
        stage1 = adaptive["self_profiles"]["stage1"]["segment_compute_s"]
        kept = [sum(stage1[:k]) / sum(stage1) for k in throttled]  # stage 1's part of the model
        kept_at_full = [sum(stage1[:k]) / sum(stage1) for k in full]
        # At most half of the model on stage 1 while throttled; more of it back at full speed.
        assert statistics.fmean(kept) <= 0.5, why
        assert statistics.fmean(kept_at_full) >= statistics.fmean(kept) + 0.1, why
        if policy == "sciot":  # stage 2 as profiled, at 60%: local wins
            assert sum(part >= 0.5 for part in kept_at_full) >= 0.6 * len(full), why
        assert adaptive["policy"] == policy and adaptive["switches"] >= 2
        events = adaptive["compute"]["reprofile_events"]
        assert events and {"seq", "stage", "segment", "why", "old_s", "new_s"} <= set(events[0])
        assert any(e["why"].startswith("cv ") for e in events)
    sciot = json.loads((runs / "mobilenetv2_tcp_lan_ksciot_r0.json").read_text())["manifest"]["stages"][0]["adaptive"]
    assert sciot["forced_local"] > 0 and sciot["compute"]["speed_ratio"] is False
