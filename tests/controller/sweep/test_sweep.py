"""The sweeper end to end on loopback: consolidated outputs, resume, and surviving a dead stage."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import PYTHON, sshd_env_file
import tcp_helpers as cli
from paretopipe.controller.sweep import rounds
from paretopipe.transport.messaging.broker import mosquitto_binary

PROFILES = """
[lan]
comment = "no shaping"
[slow]
delay = "20ms"
rate = "20mbit"
comment = "test profile"
"""


def _sweep_cmd(tmp: Path, *extra: str) -> list[str]:
    (tmp / "profiles.toml").write_text(PROFILES)
    return [PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "0,5,19",
            "--profiles", "lan,slow", "--profiles-file", str(tmp / "profiles.toml"), "--runs", "2",
            "--batch-size", "2", "--num-batches", "4", "--warmup", "1", "--out", str(tmp / "out"),
            "--session", "s", "--local", "--quiet", *extra]


@pytest.mark.slow
def test_a_sweep_of_a_detector_measures_cuts_across_its_pyramid_like_any_split(tmp_path):
    from paretopipe.partition import tables

    proc = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--model", "ssdlite320_mobilenet_v3_large", "--splits",
                    "0,15,22", "--network", "lan", "--runs", "1", "--batch-size", "1", "--num-batches", "2",
                    "--warmup", "1", "--out", str(tmp_path / "out"), "--session", "s", "--quiet"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert sorted(runs["split_index"]) == [0, 15, 22] and set(runs["status"]) == {"complete"}
    assert set(runs["workload"]) == set(pd.read_csv(session / "summary.csv")["workload"]) == {"images"}
    _, part = tables.partitioner_for("ssdlite320_mobilenet_v3_large", batch=1, structure_only=True)
    inside = runs[runs.split_index == 15].iloc[0]
    cut = part.cut(part.block_cut(15))
    assert cut.width == 2 and inside["cut"] == cut.name
    assert inside["payload_bytes_mean"] == cut.nbytes  # both tensors, one frame per batch
    # The result is the detections (boxes, scores, labels, counts for one image), whatever the split.
    assert set(runs["result_wire_bytes_mean"]) == {100 * 4 * 4 + 100 * 4 + 100 * 8 + 8}
    assert (session / "report" / "pareto.csv").is_file()


@pytest.mark.slow
def test_max_live_adds_cuts_of_several_tensors_to_a_sweep_on_both_backends(tmp_path):
    from paretopipe.partition import tables

    cut = "maxpool+layer1_0_relu"
    base = [PYTHON, "-m", "paretopipe", "sweep", "--model", "resnet18", "--network", "lan", "--runs", "1",
            "--batch-size", "2", "--num-batches", "2", "--warmup", "1", "--out", str(tmp_path / "out"), "--quiet"]
    # Named without --max-live: refused before anything starts, saying what to add.
    refused = cli.run(base + ["--splits", f"0,{cut}", "--session", "x"], timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [f"error: --splits: 2 tensors cross {cut}; add --max-live 2"]
    assert not (tmp_path / "out" / "x").exists()
    # all --max-live 2 plans the block splits and every cut of two tensors.
    planned = cli.run(base + ["--splits", "all", "--max-live", "2", "--dry-run", "--session", "y"], timeout=120)
    assert planned.returncode == 0 and "56 run" in planned.stdout, planned.stdout[-500:]
    proc = cli.run(base + ["--splits", f"0,{cut},9", "--max-live", "2", "--backend", "both", "--session", "s"],
                   timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert set(runs["status"]) == {"complete"} and len(runs) == 6
    inside = runs[runs.split_index.astype(str) == cut]
    assert set(inside["backend"]) == {"tcp", "rpc"} and set(inside["cut"]) == {cut}
    _, part = tables.partitioner_for("resnet18", batch=1, structure_only=True)
    tcp = inside[inside.backend == "tcp"].iloc[0]
    assert tcp["payload_bytes_mean"] == 2 * part.cut(cut).nbytes  # both tensors, in one frame per batch
    assert (session / "runs" / f"{tcp['run_key']}.json").is_file() and "." in tcp["run_key"]
    summary = pd.read_csv(session / "summary.csv")
    assert sorted(summary["split_index"].astype(str)) == sorted(["0", "0", "9", "9", cut, cut])
    assert (session / "report" / "pareto.csv").is_file()


@pytest.mark.slow
def test_small_sweep_end_to_end_both_backends(tmp_path):
    proc = cli.run(_sweep_cmd(tmp_path, "--backend", "both", "--drift-every", "0"), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Pareto-optimal splits and those tied with them within 95% CIs (latency_s: median per batch; " \
           "throughput in images/s):" in proc.stdout
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert len(runs) == 2 * 3 * 2 * 2 and set(runs["status"]) == {"complete"}
    assert set(runs["backend"]) == {"tcp", "rpc"}
    summary = pd.read_csv(session / "summary.csv")
    assert len(summary) == 12 and set(summary["runs"]) == {2}
    assert set(summary["split_index"]) == {0, 5, 19}  # the k=0 and k=K baselines are in
    # The slow profile costs about the emulated transfer of one batch: the bytes that cross the
    # link at 20 Mbit/s plus 20 ms each way (TCP: stage 1 -> 2; RPC: also master -> stage 1).
    for backend in ("tcp", "rpc"):
        for k in (0, 5):
            pick = (summary.backend == backend) & (summary.split_index == k)
            lan = summary[pick & (summary.network == "lan")].iloc[0]
            slow = summary[pick & (summary.network == "slow")].iloc[0]
            if backend == "tcp":
                crossing, hops = slow["payload_bytes_mean"], 2
            else:
                rec = json.loads((session / runs[(runs.backend == "rpc") & (runs.split_index == k)
                                                  & (runs.network == "slow")].iloc[0]["json"]).read_text())
                crossing, hops = sum(rec["batches"][-1]["hop_bytes"]), len(rec["batches"][-1]["hop_bytes"])
            expected = crossing * 8 / 20e6 + hops * 0.020
            # Physics, not this machine's speed: the link's serialisation and delay are a floor under
            # the slow latency, and beyond them only compute and scheduling differ (a stated 250 ms
            # margin: one busy core delays a stage's turn by tens of milliseconds).
            assert slow["latency_median_s"] >= expected, backend
            assert slow["latency_median_s"] - lan["latency_median_s"] <= expected + 0.25, backend
    session_json = json.loads((session / "session.json").read_text())
    assert session_json["complete"] and session_json["timing"]["measured_s"] > 0
    assert (session / "report" / "pareto.csv").is_file()
    rec = json.loads((session / runs.iloc[0]["json"]).read_text())
    assert rec["manifest"]["link"]["mode"] == "emulated"
    assert rec["config"]["stage_limits"]["stage1"]["torch_threads"] >= 1
    # The controller names the stages' exact torch (its +cu tag too) without importing torchvision.
    assert session_json["manifest"]["torch"] == rec["manifest"]["stages"][0]["torch"]
    assert session_json["manifest"]["torchvision"] == rec["manifest"]["stages"][0]["torchvision"]


@pytest.mark.slow
def test_a_sweep_over_ciphers_measures_each_as_its_own_configuration_and_reports_the_cost(tmp_path):
    env = tmp_path / "keyed.env"
    env.write_text("PARETOPIPE_SECRET=sweep-cipher-secret-0123456789abcdef\n")
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "5,19",
                    "--network", "lan", "--runs", "1", "--batch-size", "1", "--num-batches", "3", "--warmup", "0",
                    "--drift-every", "0", "--encrypt", "none,aesgcm", "--env-file", str(env), "--local",
                    "--out", str(tmp_path / "out"), "--session", "s", "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    # Each cipher is a configuration of its own, with its own key, measured in its own worker group.
    assert sorted(zip(runs["cipher"], runs["split_index"])) == [("aesgcm", 5), ("aesgcm", 19), ("none", 5), ("none", 19)]
    assert set(runs["run_key"]) == {"mobilenetv2_tcp_lan_k05_r0", "mobilenetv2_tcp_lan_k19_r0",
                                    "mobilenetv2_tcp_lan_k05_aesgcm_r0", "mobilenetv2_tcp_lan_k19_aesgcm_r0"}
    sealed = runs[runs["cipher"] == "aesgcm"].iloc[0]
    rec = json.loads((session / sealed["json"]).read_text())
    assert [st["cipher"]["cipher"] for st in rec["manifest"]["stages"]] == ["aesgcm", "aesgcm"]
    # No sensor on this machine: each stage's manifest says so (an empty list), and memory is measured.
    assert all(st["energy_sensors"]["sensors"] == [] for st in rec["manifest"]["stages"])
    assert rec["summary"]["stage1_peak_rss_bytes"] > 0 and rec["summary"]["stage2_model_bytes"] > 0
    assert all(b["stage1_seal_s"] > 0 and b["stage2_open_s"] > 0 for b in rec["batches"])
    plain = json.loads((session / runs[runs["cipher"] == "none"].iloc[0]["json"]).read_text())
    assert not any("seal" in k for b in plain["batches"] for k in b)
    summary = pd.read_csv(session / "summary.csv")
    assert len(summary) == 4 and set(summary["cipher"]) == {"none", "aesgcm"}
    assert set(json.loads((session / "session.json").read_text())["groups"]) == {"mobilenetv2/tcp",
                                                                                 "mobilenetv2/tcp/aesgcm"}
    # The report sets each sealed configuration beside its plain twin, and the sweep prints it.
    cost = pd.read_csv(session / "report" / "privacy_cost.csv")
    assert sorted(cost["split_index"]) == [5, 19] and set(cost["cipher"]) == {"aesgcm"}
    assert (cost["seal_open_mean_s"] > 0).all()
    for _, row in cost.iterrows():
        assert row["latency_ratio"] == pytest.approx(row["latency_sealed_s"] / row["latency_plain_s"])
    assert "What encryption costs per split" in proc.stdout
    assert (session / "report" / "front_mobilenet_v2_tcp_aesgcm_b1.png").is_file()
    assert (session / "report" / "front_mobilenet_v2_tcp_b1.png").is_file()


@pytest.mark.slow
@pytest.mark.skipif(mosquitto_binary() is None, reason="no mosquitto here (make installs it)")
def test_a_sweep_over_transports_measures_each_as_its_own_configuration_through_a_broker_it_starts(tmp_path):
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "5,12",
                    "--network", "lan", "--runs", "1", "--batch-size", "1", "--num-batches", "3", "--warmup", "0",
                    "--drift-every", "0", "--transport", "tcp,websocket,mqtt,http", "--mqtt-qos", "1", "--local",
                    "--out", str(tmp_path / "out"), "--session", "s", "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    session = tmp_path / "out" / "s"
    summary = pd.read_csv(session / "summary.csv")
    assert sorted(zip(summary["transport"], summary["split_index"])) == [
        ("http", 5), ("http", 12), ("mqtt", 5), ("mqtt", 12), ("tcp", 5), ("tcp", 12), ("websocket", 5),
        ("websocket", 12)]
    runs = pd.read_csv(session / "runs.csv")
    assert "mobilenetv2_tcp_lan_k05_mqtt_r0" in set(runs["run_key"]) and "mobilenetv2_tcp_lan_k05_r0" in set(runs["run_key"])
    for _, row in runs.iterrows():
        rec = json.loads((session / row["json"]).read_text())
        used = [st["transport"] for st in rec["manifest"]["stages"]]
        assert {u["transport"] for u in used} == {row["transport"]}
        if row["transport"] == "mqtt":
            assert all(u["qos"] == 1 and u["broker"].startswith("127.0.0.1:") for u in used)
            assert used[0]["username"] == "stage1" and used[1]["username"] == "stage2"
        if row["transport"] != "tcp":  # every frame a message, and the socket carried more than the frames
            assert used[0]["messages_sent"] >= 4 and used[0]["socket_bytes_sent"] > used[0]["bytes_sent"]
    assert set(json.loads((session / "session.json").read_text())["groups"]) == {
        "mobilenetv2/tcp", "mobilenetv2/tcp/websocket", "mobilenetv2/tcp/mqtt", "mobilenetv2/tcp/http"}
    cost = pd.read_csv(session / "report" / "transport_cost.csv")
    assert sorted(zip(cost["transport"], cost["split_index"])) == [("http", 5), ("http", 12), ("mqtt", 5), ("mqtt", 12),
                                                                   ("websocket", 5), ("websocket", 12)]
    assert "What each transport costs per split" in proc.stdout
    assert (session / "report" / "front_mobilenet_v2_tcp_mqtt_b1.png").is_file()


@pytest.mark.slow
def test_a_latency_memory_front_differs_from_latency_throughput_on_a_model_where_they_disagree(tmp_path):
    """MobileNetV2 on a 1 Mbit/s link: running everything on stage 1 (k=19) is fastest and sends 40
    bytes, so it alone is the latency/throughput front; but it puts the whole model on one device,
    and an inner split leaves both stages smaller, so the latency/memory front holds that split too.
    Memory here is each stage's parameters plus its largest activation, exact per split. The link
    puts 250 ms (k=15) and 400 ms (k=8) of transfer beside the whole model's compute; at 5 Mbit/s
    (50 and 80 ms) a loaded pass once measured k=19 behind both."""
    (tmp_path / "nets.toml").write_text('[link1]\nrate = "1mbit"\n')
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "8,15,19",
                    "--network", "link1", "--network-file", str(tmp_path / "nets.toml"), "--runs", "1",
                    "--batch-size", "1", "--num-batches", "3", "--warmup", "0", "--drift-every", "0",
                    "--objectives", "latency,memory", "--local", "--out", str(tmp_path / "out"), "--session",
                    "s", "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory_model_bytes" in proc.stdout  # the closing table shows the objective's column
    from paretopipe.analysis.report import pareto_table

    session = tmp_path / "out" / "s"
    memory = pareto_table(session, resamples=10, objectives="latency,memory")
    speed = pareto_table(session, resamples=10)

    def front(table):
        return set(table.loc[table["front_status"] == "front", "split_index"].astype(int))

    assert front(speed) == {19}
    assert 19 in front(memory) and len(front(memory)) >= 2
    by_k = memory.set_index(memory["split_index"].astype(int))["memory_model_bytes"]
    assert by_k[19] == by_k.max() and by_k[15] < by_k[19]
    pareto = pd.read_csv(session / "report" / "pareto.csv")  # the sweep's own report used its objectives
    assert set(pareto.loc[pareto["front_status"] == "front", "split_index"]) == front(memory)


@pytest.mark.slow
def test_interrupted_sweep_resumes_only_what_is_missing(tmp_path):
    proc = cli.popen(_sweep_cmd(tmp_path, "--no-report"))
    runs_dir = tmp_path / "out" / "s" / "runs"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(runs_dir.glob("*.json"))) < 3:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    before = {p.name: p.stat().st_mtime_ns for p in runs_dir.glob("*.json")}
    assert 3 <= len(before) < 12
    deadline = time.monotonic() + 20
    while cli.workers(proc):  # the interrupted sweep's stages end with it
        assert time.monotonic() < deadline, cli.workers(proc)
        time.sleep(0.1)
    resumed = cli.run(_sweep_cmd(tmp_path, "--resume", "--no-report"), timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in runs_dir.glob("*.json")}
    assert len(after) == 12
    assert all(after[name] == mtime for name, mtime in before.items())  # done runs were not redone
    assert len(pd.read_csv(tmp_path / "out" / "s" / "runs.csv")) == 12
    # This sweep keeps its drift reference (most real sweeps prove plumbing with --drift-every 0):
    # its baseline runs are measured, and kept apart from the configurations' runs.
    reference = list((tmp_path / "out" / "s" / "reference").glob("*.json"))
    assert len(reference) >= rounds.DriftMonitor.BASELINE_RUNS
    assert not {p.name for p in reference} & set(after)


@pytest.mark.slow
def test_stage_killed_mid_sweep_is_recorded_and_the_rest_completes(tmp_path):
    proc = cli.popen(_sweep_cmd(tmp_path, "--no-report"))
    runs_dir = tmp_path / "out" / "s" / "runs"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(runs_dir.glob("*.json"))) < 2:
        time.sleep(0.2)
    workers = [w for w in cli.workers(proc) if "--role stage2" in " ".join(w.cmdline())]
    assert workers, "no stage 2 worker found"
    # forked from the sweep's zygote, which imported torch once for both stages
    assert "paretopipe.controller.zygote" in " ".join(workers[0].parent().cmdline())
    workers[0].kill()
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-2000:]
    failures = pd.read_csv(tmp_path / "out" / "s" / "failures.csv")
    assert len(failures) >= 1 and failures["error"].str.contains("stage2|worker|peer", regex=True).all()
    runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv")
    assert len(runs) == 12 and set(runs["status"]) == {"complete"}


def test_remote_mode_over_real_ssh(sshd, tmp_path):
    """Hosts from .env: workers start over SSH (both 'hosts' are 127.0.0.1), records come back."""
    env_file = sshd_env_file(sshd, tmp_path)
    proc = cli.run([PYTHON, "automated_split_tester.py", "--env-file", str(env_file), "--model", "mobilenetv2",
                    "--splits", "0,5", "--profiles", "lan", "--runs", "1", "--batch-size", "1",
                    "--num-batches", "3", "--warmup", "1", "--link", "emulated", "--threads", "1",
                    "--drift-every", "0",
                    "--out", str(tmp_path / "out"), "--session", "r", "--no-report", "--quiet"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "out" / "r" / "runs.csv")
    assert sorted(runs["split_index"]) == [0, 5] and set(runs["status"]) == {"complete"}
    session = json.loads((tmp_path / "out" / "r" / "session.json").read_text())
    hosts = session["options"]["testbed"]["hosts"]
    assert [h["address"] for h in hosts] == ["127.0.0.1", "127.0.0.1"] and all("key" not in h for h in hosts)
    assert "secret" not in json.dumps(session["options"])


@pytest.mark.slow
def test_a_batch_slower_than_60_s_on_3g_is_measured_not_failed(tmp_path):
    """MobileNetV2 k=2 at batch 8 sends 6.4 MB a batch: 67 s over 3G's 768 kbit/s uplink, past the
    fixed 60 s timeout that failed this sweep. The deadline follows the link, so the run completes."""
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "2",
                    "--network", "3g", "--runs", "1", "--batch-size", "8", "--num-batches", "1", "--warmup", "0",
                    "--drift-every", "0", "--out", str(tmp_path), "--session", "s", "--local", "--quiet",
                    "--no-report"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "s" / "runs.csv")
    assert list(runs["status"]) == ["complete"]
    assert runs["latency_median_s"].iloc[0] > 6_422_528 * 8 / 768e3 > 60
    record = json.loads((tmp_path / "s" / runs["json"].iloc[0]).read_text())
    assert record["config"]["timeout_s"] > 3 * 66.9


@pytest.mark.slow
def test_max_batch_s_makes_a_configuration_infeasible_and_the_sweep_goes_on(tmp_path):
    """A deadline the user sets is a measured outcome: k=2 (67 s a batch on 3G) is recorded as
    infeasible within --max-batch-s, drawn as dominated, and the sweep measures k=19 and exits 0."""
    started = time.monotonic()
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "2,19",
                    "--network", "3g", "--runs", "1", "--batch-size", "8", "--num-batches", "2", "--warmup", "0",
                    "--max-batch-s", "5", "--drift-every", "0", "--order", "sequential", "--out", str(tmp_path),
                    "--session", "s", "--local", "--quiet"],
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - started < 67  # it did not wait for the 67 s batch
    session = tmp_path / "s"
    runs = pd.read_csv(session / "runs.csv").set_index("split_index")
    assert runs.loc[2, "status"] == "infeasible" and "--max-batch-s 5" in runs.loc[2, "error"]
    assert runs.loc[19, "status"] == "complete"
    summary = pd.read_csv(session / "summary.csv").set_index("split_index")
    assert summary.loc[2, "status"] == "infeasible" and summary.loc[2, "runs"] == 0
    assert summary.loc[2, "infeasible_runs"] == 1 and "--max-batch-s" in summary.loc[2, "infeasible_reason"]
    assert summary.loc[19, "status"] == "complete"
    pareto = pd.read_csv(session / "report" / "pareto.csv").set_index("split_index")
    assert pareto.loc[2, "front_status"] == "dominated" and not pareto.loc[2, "on_front"]
    assert pareto.loc[19, "front_status"] == "front"
    meta = json.loads((session / "session.json").read_text())
    assert meta["runs_infeasible"] == 1
    stops = {k[-3:]: v["stop_reason"] for k, v in meta["groups"]["mobilenetv2/tcp"]["stopping"].items()}
    assert stops == {"k02": "infeasible", "k19": "runs"}
    assert not (session / "failures.csv").read_text().strip().splitlines()[1:]  # no failure recorded


@pytest.mark.slow
def test_a_sweep_runs_tcp_chains_of_three_stages_with_every_hop_and_stage_in_its_records(tmp_path):
    """--split-blocks on the TCP backend: three stage workers joined in a chain (the middle one
    listens for the last), every run complete, each hop's bytes the cut's, every stage's part."""
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--split-blocks", "5,12;8,15",
                    "--backend", "tcp", "--network", "wifi", "--batch-size", "2", "--num-batches", "4", "--warmup", "1",
                    "--runs", "1", "--local", "--drift-every", "0", "--out", str(tmp_path), "--session", "s"],
                   timeout=600)
    assert done.returncode == 0, done.stderr
    runs = pd.read_csv(tmp_path / "s" / "runs.csv")
    assert sorted(runs["split_index"]) == ["5,12", "8,15"] and set(runs["backend"]) == {"tcp"}
    part = cli.builder("mobilenetv2").partitioner
    for _, row in runs.iterrows():
        rec = json.loads((tmp_path / "s" / row["json"]).read_text())
        ks = [int(k) for k in row["split_index"].split(",")]
        assert rec["status"] == "complete" and rec["config"]["cuts"] == [part.block_cut(k) for k in ks]
        assert [s["role"] for s in rec["manifest"]["stages"]] == ["stage1", "stage2", "stage3"]
        for b in rec["batches"]:
            assert b["hop_bytes"][:2] == [part.payload_nbytes(part.block_cut(k), 2) for k in ks]
            assert b["hop_bytes"][2] == 2 * 10 * 4   # the logits on their way back
        assert rec["summary"]["stage3_compute_median_s"] > 0 and rec["summary"]["stage3_peak_rss_bytes"] > 0
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert len(summary) == 2 and (summary["latency_median_s"] > 0).all()


@pytest.mark.slow
def test_a_sweep_over_several_wire_dtypes_measures_each_with_its_bytes_and_what_it_kept(tmp_path):
    """--wire-dtype float32,int8,int4: each a pass of its own over the splits; int8 sends a quarter
    of float32's bytes plus one float32 scale per channel, int4 half of that plus a scale per 32
    values and the tensor's shape; each lossy pass is evaluated against the unsplit model, and the report draws bytes
    against agreement, one curve per split."""
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4,14",
                    "--wire-dtype", "float32,int8,int4", "--batch-size", "1", "--num-batches", "3", "--warmup", "1",
                    "--runs", "1", "--eval-samples", "16", "--local", "--out", str(tmp_path / "out"),
                    "--session", "s", "--quiet"], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    session = tmp_path / "out" / "s"
    summary = pd.read_csv(session / "summary.csv").set_index(["split_index", "codec"])
    assert len(summary) == 6 and set(summary["status"]) == {"complete"}
    for k, channels, values in ((4, 24, 24 * 56 * 56), (14, 96, 96 * 14 * 14)):
        f32 = summary.loc[(k, "float32/none"), "payload_bytes_mean"]
        assert f32 == values * 4
        assert summary.loc[(k, "int8/none"), "payload_bytes_mean"] == values + 4 * channels
        # int4: two values a byte, a float32 scale per 32 values of the sample, and its shape (4 int64s)
        assert summary.loc[(k, "int4/none"), "payload_bytes_mean"] == values // 2 + 4 * (values // 32) + 32
        for codec in ("int8/none", "int4/none"):
            assert summary.loc[(k, codec), "fidelity_samples"] == 16
            assert 0 <= summary.loc[(k, codec), "fidelity_top1_agreement"] <= 1
    assert (session / "report" / "fidelity_mobilenet_v2_tcp_lan_1.png").stat().st_size > 10_000
    groups = json.loads((session / "session.json").read_text())["groups"]
    assert set(groups) == {"mobilenetv2/tcp/float32", "mobilenetv2/tcp/int8", "mobilenetv2/tcp/int4"}


def test_a_search_takes_several_wire_dtypes_as_a_dimension_not_as_a_list(tmp_path):
    done = cli.run([PYTHON, "-m", "paretopipe", "search", "--model", "mobilenetv2", "--wire-dtype", "int8,int4",
                    "--budget", "2", "--local", "--out", str(tmp_path)], timeout=300)
    assert done.returncode == 2 and "--vary codec=int8/none,int4/none" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_folder_smaller_than_its_evaluation_is_refused_before_anything_runs(tmp_path):
    """int8's evaluation takes 64 images by default: a folder of 3 is refused in one line at once,
    not in every run's record after its timed batches."""
    from PIL import Image

    for label in ("0", "1"):
        (tmp_path / "imgs" / label).mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (40, 40), (i * 40, 0, 0)).save(tmp_path / "imgs" / str(i % 2) / f"{i}.png")
    base = [PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4", "--local", "--dry-run",
            "--dataset", f"imagefolder:{tmp_path / 'imgs'}", "--out", str(tmp_path / "out")]
    done = cli.run([*base, "--wire-dtype", "float32,int8"], timeout=300)
    assert done.returncode == 2 and "--eval-samples 64: the dataset" in done.stderr and "holds 3 images" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert cli.run([*base, "--wire-dtype", "int8", "--eval-samples", "3"], timeout=300).returncode == 0
