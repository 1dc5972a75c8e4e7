"""The static-vs-adaptive comparison: the best static split in hindsight may be a cut of several
tensors (the adaptive split may choose one), and the latency-over-time figure draws a run whose
batches chose such a cut (no block index: a gap in the split line) without failing."""

from __future__ import annotations

import json
import math

import pandas as pd

from paretopipe.analysis import adaptive_comparison as adaptive
from paretopipe.analysis.plotting import pyplot
from paretopipe.analysis.session import Session

FINE = "features_2_conv_3+features_3_conv_3"


def _configs() -> pd.DataFrame:
    rows = [("8", 0.090), ("19", 0.060), (FINE, 0.050), ("3,9", 0.010), ("adaptive", 0.052)]
    return pd.DataFrame([{"model": "mobilenet_v2", "backend": "tcp", "network": "trace-step", "batch_size": 1,
                          "split_index": split, "latency_median_s": lat, "latency_p95_s": lat * 1.5,
                          "throughput_imgs_per_s": 1 / lat, "runs": 1} for split, lat in rows])


def test_the_best_static_split_may_be_a_cut_of_several_tensors_but_never_a_plan():
    table, verdicts = adaptive.comparison(_configs())
    (verdict,) = verdicts.to_dict("records")
    assert verdict["best_static_split"] == FINE   # the plan 3,9 is faster but not a two-stage split
    assert verdict["adaptive_over_best_latency"] == 0.052 / 0.050 and verdict["within_goal"]
    roles = dict(zip(table["split_index"], table["role"]))
    assert roles == {"8": "static", "19": "static", FINE: "best static", "3,9": "static", "adaptive": "adaptive"}


def _record(batches: list[dict]) -> dict:
    return {"manifest": {"link": {"mode": "emulated"}}, "batches": batches}


def test_the_figure_draws_an_adaptive_run_that_chose_a_cut_of_several_tensors(tmp_path):
    fine = [{"start_s": 0.1 * i, "latency_s": 0.05, "split_k": None, "split_candidate": 1,
             "served_locally": False} for i in range(5)]
    local = [{"start_s": 0.5 + 0.1 * i, "latency_s": 0.06, "split_k": 19, "split_candidate": 2,
              "served_locally": i == 0} for i in range(5)]
    files = {"adaptive": _record(fine + local), FINE: _record(fine), "19": _record(local)}
    for i, (split, rec) in enumerate(files.items()):
        (tmp_path / f"r{i}.json").write_text(json.dumps(rec))
    runs = pd.DataFrame([{"network": "trace-step", "split_index": split, "status": "complete", "run": 0,
                          "json": f"r{i}.json"} for i, split in enumerate(files)])
    plt = pyplot()
    fig = plt.figure()
    adaptive.plot_over_time(Session(tmp_path), runs, {"network": "trace-step", "best_static_split": FINE}, fig, "t")
    top, bottom, twin = fig.axes
    assert [line.get_label() for line in top.get_lines()] == ["adaptive", "static k=19", f"static {FINE}"]
    step, crosses = twin.get_lines()
    ks = list(step.get_ydata())
    assert all(math.isnan(k) for k in ks[:5]) and ks[5:] == [19] * 5   # no block index while on the cut
    assert list(crosses.get_ydata()) == [19]                             # the batch served locally
    plt.close(fig)


def test_sciots_rule_stands_beside_ours_and_each_reaction_is_counted_in_batches():
    configs = pd.concat([_configs(), _configs().iloc[[4]].assign(split_index="sciot", latency_median_s=0.060)])
    table, verdicts = adaptive.comparison(configs, {("mobilenet_v2", "tcp", "trace-step", 1): {"adaptive": 3.0,
                                                                                                "sciot": 1.0}})
    (v,) = verdicts.to_dict("records")
    assert v["sciot_over_best_latency"] == 0.060 / 0.050 and not v["sciot_within_goal"]
    assert v["adaptive_reaction_batches_median"] == 3.0 and v["sciot_reaction_batches_median"] == 1.0
    assert set(table["role"]) == {"static", "best static", "adaptive", "sciot"}
    # A compute trace stepping at 1 s and 2 s: the first change answered after 3 batches, the second
    # not before the run ended.
    record = {"manifest": {"link": {}, "stages": [{"cpu_traces": [{"stage": "stage1", "steps": [
        {"t_s": 0.0, "cpu_share": 1.0}, {"t_s": 1.0, "cpu_share": 0.4}, {"t_s": 2.0, "cpu_share": 1.0}]}]}]},
        "batches": [{"start_s": 0.25 * i, "switched": i == 6, "warmup": False} for i in range(12)]}
    assert adaptive.change_times(record) == [1.0, 2.0]
    assert adaptive.reaction_batches(record) == [3]
    assert adaptive.share_over_time(record) == ([0.0, 1.0, 2.0, 2.75], [1.0, 0.4, 1.0, 1.0])


def _closed_loop(phases: list[tuple[float, float]], count: int) -> list[dict]:
    """``count`` back-to-back batches of a closed loop through phases of (seconds, latency)."""
    out, t, edges = [], 0.0, []
    for length, lat in phases:
        edges.append((t + length, lat))
        t += length
    t = 0.0
    for i in range(count):
        lat = next((lat for end, lat in edges if t < end), edges[-1][1])
        out.append({"seq": i, "warmup": False, "start_s": t, "end_s": t + lat, "latency_s": lat})
        t += lat
    return out


def test_the_comparison_weighs_each_phase_of_a_trace_by_its_time_not_by_its_batches(tmp_path):
    # 6 s fast then 8 s throttled. Static k=19: 10 ms, then 40 ms; the policy: 12 ms, then 20 ms.
    # k=19 runs 600 fast batches and 200 throttled ones (median 10 ms), the policy 500 and 400
    # (median 12 ms): over batches the static split wins. Over the 14 s both covered, k=19 spends
    # 8 s at 40 ms and the policy 8 s at 20 ms: by time the policy wins, and so does k=0 (30 ms).
    files = {"19": _closed_loop([(6.0, 0.010), (8.0, 0.040)], 800),
             "0": _closed_loop([(14.0, 0.030)], 470),
             "adaptive": _closed_loop([(6.0, 0.012), (8.0, 0.020)], 900)}
    assert adaptive.time_weighted_median(files["19"], 14.0) == 0.040   # 8 of 14 s at 40 ms
    assert adaptive.time_weighted_median(files["19"], 10.0) == 0.010   # 6 of 10 s at 10 ms
    for b in files["adaptive"]:
        b["split_k"] = 19 if b["start_s"] < 6 else 0
    rows = []
    for i, (split, batches) in enumerate(files.items()):
        (tmp_path / f"r{i}.json").write_text(json.dumps({"batches": batches}))
        lats = [b["latency_s"] for b in batches]
        rows.append({"model": "m", "backend": "tcp", "network": "throttle", "batch_size": 1, "split_index": split,
                     "run": 0, "status": "complete", "json": f"r{i}.json", "latency_median_s": float(pd.Series(lats).median()),
                     "latency_p95_s": max(lats), "throughput_imgs_per_s": 1 / max(lats), "runs": 1})
    frame = pd.DataFrame(rows)
    spans = adaptive.span_medians(Session(tmp_path), frame)
    key = ("m", "tcp", "throttle", 1)
    # The span is the shortest run's: the policy's and k=19's end at 14 s, k=0's at 14.1 s.
    assert spans[key] == {"19": 0.040, "0": 0.030, "adaptive": 0.020}
    _, by_batches = adaptive.comparison(frame)
    (b,) = by_batches.to_dict("records")
    assert b["compared_by"] == adaptive.BATCHES and b["best_static_split"] == "19" and not b["beats_best_static"]
    starts = adaptive.start_splits(Session(tmp_path), frame)
    assert starts == {key: {"adaptive": "19"}}
    table, by_time = adaptive.comparison(frame, spans=spans, starts=starts)
    (v,) = by_time.to_dict("records")
    assert v["compared_by"] == adaptive.SPAN and v["best_static_split"] == "0"
    assert v["adaptive_over_best_latency"] == 0.020 / 0.030 and v["beats_best_static"]
    assert v["adaptive_started_at"] == "19" and v["adaptive_over_start_latency"] == 0.020 / 0.040
    assert v["adaptive_latency_median_s"] == 0.012          # the median over batches stays beside it
    assert dict(zip(table["split_index"], table["latency_span_median_s"])) == spans[key]
    assert "adaptive time-weighted median 20.0 ms vs best static k=0 30.0 ms (0.67x" in adaptive.format_verdicts(by_time)
