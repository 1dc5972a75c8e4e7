"""The session folder has one owner: records in, CSVs out, unreadable records skipped and named."""

from __future__ import annotations


import pytest

from paretopipe import records
from paretopipe.analysis.keys import CONFIG_KEY, ConfigKey, config_key, panel_names, run_key
from paretopipe.analysis.session import Session, find_session
from paretopipe.errors import UsageError


def _record(run: int, k: int, latency: float) -> dict:
    cfg_key = config_key("mobilenet_v2", "tcp", "lan", k)
    batches = [{"seq": i, "warmup": False, "start_s": i * 0.1, "end_s": i * 0.1 + latency, "latency_s": latency}
               for i in range(4)]
    return records.build_run_record(
        backend="tcp", run_id=f"r{run}k{k}", status="complete", error=None,
        config={"model": "mobilenet_v2", "cuts": ["c"], "split_index": k, "batch_size": 1, "in_flight": 1,
                "network": "lan", "run_key": run_key(cfg_key, run), "config_key": cfg_key, "run": run},
        manifest={"stages": [], "link": {"mode": "emulated"}}, batches=batches, sysmon={})


def test_consolidation_from_records_and_truncated_ones_are_skipped(tmp_path):
    s = Session(tmp_path / "s")
    for run in (0, 1):
        for k, lat in ((0, 0.2), (3, 0.1)):
            s.write_run(run_key(config_key("mobilenet_v2", "tcp", "lan", k), run), _record(run, k, lat + run / 100))
    (s.runs_dir / "broken.json").write_text('{"summary": {"lat')
    rows, skipped = s.consolidate([{"run_key": "x", "attempt": 1, "error": "e", "time_utc": "t"}], final=True)
    assert skipped == ["broken.json"] and len(rows) == 4
    assert rows[0]["config_key"] == "mobilenet_v2_tcp_lan_k00" and rows[0]["json"].startswith("runs/")
    configs = s.configs()
    assert list(configs[CONFIG_KEY].itertuples(index=False, name=None)) == [
        ("mobilenet_v2", "tcp", "none", "tcp", "lan", 1, 0, "float32/none", 1, "closed", 0, "none", "in-order", "torch"),
        ("mobilenet_v2", "tcp", "none", "tcp", "lan", 1, 3, "float32/none", 1, "closed", 0, "none", "in-order", "torch")]
    assert configs["runs"].tolist() == [2, 2]
    assert configs.loc[0, "latency_median_s"] == pytest.approx(0.205)
    assert s.completed("mobilenet_v2_tcp_lan_k03_r1") and not s.completed("nope")
    assert find_session(tmp_path).path == s.path


def test_meta_round_trip_and_bad_folders(tmp_path):
    s = Session(tmp_path / "s")
    assert s.read_meta() is None
    s.write_meta({"a": 1})
    assert s.read_meta() == {"a": 1}
    s.meta_path.write_text("[1, 2")
    with pytest.raises(UsageError, match="not readable JSON"):
        s.read_meta()
    with pytest.raises(UsageError, match="no sweep results under .*no such folder"):
        find_session(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        find_session(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "runs.csv").write_text("")
    with pytest.raises(UsageError, match=r"runs.csv is empty: no run of .*empty was recorded") as empty:
        Session(tmp_path / "empty").runs()
    assert "resume" not in str(empty.value)  # nothing to resume: it says what happened instead
    (tmp_path / "empty" / "runs.csv").write_bytes(b"model,backend\n\xff\xfe,\x00\x00\n")
    with pytest.raises(UsageError, match="not a readable CSV"):
        Session(tmp_path / "empty").runs()


def test_sessions_under_is_the_one_newest_session_rule(tmp_path):
    import os

    from paretopipe.analysis.keys import split_label
    from paretopipe.analysis.session import CONSOLIDATED, sessions_under

    for i, name in enumerate(["b-older", "a-newer", CONSOLIDATED]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.csv").write_text("run_key\n")
        os.utime(tmp_path / name, (1_000_000 + i, 1_000_000 + i))  # write order, not name order
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "session.json").write_text("{}")  # interrupted before its first run
    os.utime(tmp_path / "started", (2_000_000, 2_000_000))
    assert [p.name for p in sessions_under(tmp_path)] == ["b-older", "a-newer"]
    assert [p.name for p in sessions_under(tmp_path, "session.json")] == ["started"]
    assert find_session(tmp_path).path.name == "a-newer"  # the consolidated view is not a session
    assert [split_label(s) for s in (3, (3, 9), [3, 9], "adaptive")] == [3, "3,9", "3,9", "adaptive"]


def test_the_session_owns_its_reference_drifted_and_trace_control_files(tmp_path):
    s = Session(tmp_path / "s")
    assert not s.measured_anything()
    key = run_key(config_key("mobilenet_v2", "tcp", "lan", 3), 0)
    s.write_reference("ref_r0", _record(0, 3, 0.1))
    assert s.reference_path("ref_r0").is_file() and s.measured_anything()
    # A reference run is not a run of the sweep.
    assert s.consolidate([], final=True)[0] == []
    s.write_run(key, _record(0, 3, 0.1))
    s.set_aside(key)
    assert not s.run_path(key).exists() and s.drifted_path(key).is_file()
    assert s.consolidate([], final=True)[0] == []  # set aside: out of the summaries, kept on disk
    s.set_aside("never-written")  # nothing to move is no error
    # A trace controller's log: one file label, never a path, whatever the network or host is called.
    path = s.trace_control_path("lte/../x-10.0.0.2-up")
    assert path.parent == s.path / "trace-control" and "/" not in path.name and ".." not in path.name


#: Student's t quantile t(0.975) at 2 degrees of freedom, in closed form: (2p - 1) sqrt(2 / (4p(1 - p))).
T_975_2DF = 0.95 * (2 / (4 * 0.975 * 0.025)) ** 0.5


def _row(k: int, run: int, latency: float, throughput: float, status: str = "complete") -> dict:
    return {"model": "mobilenet_v2", "backend": "tcp", "cipher": "none", "network": "lan", "batch_size": 1,
            "split_index": k, "cut": f"c{k}", "run": run, "status": status, "latency_median_s": latency,
            "throughput_imgs_per_s": throughput, "batches_measured": 4, "error": None}


def test_summarize_runs_gives_the_hand_computed_median_p95_and_log_t_interval():
    """Three runs a factor 2 apart: their logs are ln 0.2 -+ ln 2, so the mean of the logs is ln 0.2,
    their standard deviation ln 2, and the 95% interval of the median is 0.2 * exp(-+ t ln 2 / sqrt 3)."""
    import math

    from paretopipe.analysis.summarize import summarize_runs

    rows = [_row(3, r, lat, tp) for r, (lat, tp) in enumerate([(0.1, 40.0), (0.2, 20.0), (0.4, 10.0)])]
    rows.append(_row(5, 0, 9.0, 0.1, status="infeasible"))
    (entry,), infeasible = [e for e in summarize_runs(rows) if e["status"] == "complete"], \
        [e for e in summarize_runs(rows) if e["status"] == "infeasible"]
    half = T_975_2DF * math.log(2) / math.sqrt(3)
    assert entry["runs"] == 3 and entry["latency_median_s"] == pytest.approx(0.2)
    assert entry["latency_median_p95_s"] == pytest.approx(0.2 + 0.9 * 0.2)  # linear between the 2nd and 3rd
    assert entry["latency_median_ci95_low_s"] == pytest.approx(0.2 * math.exp(-half), rel=1e-12)
    assert entry["latency_median_ci95_high_s"] == pytest.approx(0.2 * math.exp(half), rel=1e-12)
    assert entry["throughput_ci95_low_imgs_per_s"] == pytest.approx(20 * math.exp(-half), rel=1e-12)
    assert entry["throughput_ci95_high_imgs_per_s"] == pytest.approx(20 * math.exp(half), rel=1e-12)
    assert infeasible[0]["split_index"] == 5 and infeasible[0]["runs"] == 0 and infeasible[0]["infeasible_runs"] == 1


def test_median_ci_by_hand_for_one_run_and_for_values_without_logs():
    import math

    assert records.median_ci([0.3]) == (0.3, 0.3) and records.median_ci([None]) == (None, None)
    # A zero has no log: a t interval on the values, mean 1 and standard deviation 1.
    low, high = records.median_ci([0.0, 1.0, 2.0])
    assert (low, high) == (pytest.approx(1 - T_975_2DF / math.sqrt(3)), pytest.approx(1 + T_975_2DF / math.sqrt(3)))


def test_one_config_key_type_keys_the_tables_the_file_names_and_the_stopping_rules(tmp_path):
    key = ConfigKey("mobilenet_v2", "tcp", "none", "tcp", "lan", 1, "3")
    assert CONFIG_KEY == ["model", "backend", "cipher", "transport", "network", "batch_size", "split_index", "codec",
                          "in_flight", "scenario", "prompt_len", "fault", "placement", "engine"]
    assert key.split_index == 3 and key == ConfigKey.of({**dict(zip(CONFIG_KEY, key.__dict__.values())), "x": 1})
    assert key.text == config_key("mobilenet_v2", "tcp", "lan", 3) == "mobilenet_v2_tcp_lan_k03"
    assert ConfigKey("resnet18", "tcp", "aesgcm", "tcp", "lte", 8, (3, 9)).text == "resnet18_tcp_lte_k3-9_aesgcm"
    # Over another transport than raw TCP, a configuration's key ends in it (a TCP one keeps its old key).
    assert ConfigKey("resnet18", "tcp", "none", "mqtt", "lte", 8, 3).text == "resnet18_tcp_lte_k03_mqtt"
    assert config_key("m", "tcp", "lan", 3, "aesgcm", "websocket") == "m_tcp_lan_k03_aesgcm_websocket"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float16/zstd")) == ("m, tcp backend, batch 1, float16/zstd",
                                                                        "m_tcp_b1_float16-zstd")
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none"))[1] == "m_tcp_b1"
    # An in-flight depth is named only where a table holds several (a search that varied it).
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 3))[1] == "m_tcp_b1"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 3), depths=True) == (
        "m, tcp backend, batch 1, 3 in flight", "m_tcp_b1_w3")
    # A LoadGen scenario ends the key, the run files' names and a panel's (the closed loop's keep theirs).
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3, scenario="server").text == "m_tcp_lan_k03_server"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "offline")) == (
        "m, tcp backend, batch 1, under LoadGen offline", "m_tcp_b1_offline")
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed"))[1] == "m_tcp_b1"
    # A fault ends them too (a sweep's --fault; none keeps the names they had).
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3, fault="stage2:kill@20+2").text == \
        "m_tcp_lan_k03_stage2_kill_20_2"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "link:down@5+1")) == (
        "m, tcp backend, batch 1, fault link:down@5+1", "m_tcp_b1_link_down_5_1")
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "none"))[1] == "m_tcp_b1"
    # And a placement of the testbed's hosts (--placements; in-order keeps the names they had).
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, "2,4", placement="1-3-2").text == "m_tcp_lan_k2-4_h1-3-2"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "none", "1-3-2")) == (
        "m, tcp backend, batch 1, on hosts 1-3-2", "m_tcp_b1_h1-3-2")
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "none", "in-order"))[1] == \
        "m_tcp_b1"
    # An engine other than torch ends them too (--engine; torch keeps the names they had).
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3, engine="onnxruntime").text == "m_tcp_lan_k03_onnxruntime"
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3, engine="onnxruntime+torch").text == \
        "m_tcp_lan_k03_onnxruntime_torch"
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "none", "in-order",
                        "openvino")) == ("m, tcp backend, batch 1, engine openvino", "m_tcp_b1_openvino")
    assert panel_names(("m", "tcp", "none", "tcp", 1, "float32/none", 1, "closed", 0, "none", "in-order",
                        "torch"))[1] == "m_tcp_b1"
    # Another codec than float32 uncompressed ends the key too (a search may vary it).
    assert ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3, "float16/zstd").text == "m_tcp_lan_k03_float16-zstd"
    assert ConfigKey.of({"model": "m", "backend": "tcp", "network": "lan", "batch_size": 1, "split_index": 3}) \
        == ConfigKey("m", "tcp", "none", "tcp", "lan", 1, 3)   # a row from before codecs: float32 uncompressed
    s = Session(tmp_path / "s")
    for run in (0, 1):
        for k in (0, 3):
            s.write_run(run_key(config_key("mobilenet_v2", "tcp", "lan", k), run), _record(run, k, 0.1))
    s.consolidate([], final=True, stopping={key: {"stop_reason": "precise"}})
    summary = s.configs().set_index("split_index")
    assert summary.loc[3, "stop_reason"] == "precise" and summary.loc[0, "stop_reason"] != "precise"


def test_session_json_is_written_from_one_typed_record_in_the_shape_it_always_had(tmp_path):
    from paretopipe.analysis.session import SessionMeta

    meta = SessionMeta(schema_version=2, created_utc="t0", options={"runs": 3}, manifest={"role": "controller"},
                       networks={"lan": {}})
    assert list(meta.to_dict()) == ["schema_version", "created_utc", "options", "manifest", "networks", "complete",
                                    "runs_complete", "runs_infeasible", "unreadable_runs", "timing", "failures"]
    group = meta.group("m/tcp", order="random", seed=7, precision=None, min_runs=3, max_runs=3,
                       reference={"network": "lan", "split": 4})
    group.executed.append("k_r0")
    again = meta.group("m/tcp", order="random", seed=7, precision=None, min_runs=3, max_runs=9,
                       reference={"network": "lan", "split": 4})  # a retried group keeps what it executed
    assert again.executed == ["k_r0"] and again.max_runs == 9
    again.stopping = {"k": {"stop_reason": "runs"}}
    meta.interrupted = False
    Session(tmp_path / "s").write_meta(meta)
    written = Session(tmp_path / "s").read_meta()
    assert written["groups"] == {"m/tcp": {"order": "random", "seed": 7, "precision": None, "min_runs": 3,
                                           "max_runs": 9, "reference": {"network": "lan", "split": 4},
                                           "executed": ["k_r0"], "stopping": {"k": {"stop_reason": "runs"}}}}
    assert written["interrupted"] is False and "resumed_utc" not in written
