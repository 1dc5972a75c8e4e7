"""The sweeper end to end on loopback: consolidated outputs, resume, and surviving a dead stage."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from conftest import PYTHON, ROOT, sshd_env_file
from paretopipe.runners import sweep
from paretopipe.errors import UsageError

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


def test_parse_splits():
    assert sweep.parse_splits("all", 4) == [0, 1, 2, 3, 4]
    assert sweep.parse_splits("1,3-4,3", 4) == [1, 3, 4]
    with pytest.raises(UsageError, match=r"split index 9 out of range: valid 0\.\.4"):
        sweep.parse_splits("9", 4)
    with pytest.raises(UsageError, match="bad --splits"):
        sweep.parse_splits("x-y", 4)


def test_small_sweep_end_to_end_both_backends(tmp_path):
    proc = subprocess.run(_sweep_cmd(tmp_path, "--backend", "both"), capture_output=True, text=True, cwd=ROOT,
                          timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Pareto-optimal splits" in proc.stdout
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
            assert slow["latency_median_s"] - lan["latency_median_s"] == pytest.approx(expected, rel=0.35), backend
    session_json = json.loads((session / "session.json").read_text())
    assert session_json["complete"] and session_json["timing"]["measured_s"] > 0
    assert (session / "report" / "pareto.csv").is_file()
    rec = json.loads((session / runs.iloc[0]["json"]).read_text())
    assert rec["manifest"]["link"]["mode"] == "emulated"
    assert rec["config"]["stage_limits"]["stage1"]["torch_threads"] >= 1
    # The controller names the stages' exact torch (its +cu tag too) without importing torchvision.
    assert session_json["manifest"]["torch"] == rec["manifest"]["stages"][0]["torch"]
    assert session_json["manifest"]["torchvision"] == rec["manifest"]["stages"][0]["torchvision"]


def test_interrupted_sweep_resumes_only_what_is_missing(tmp_path):
    proc = subprocess.Popen(_sweep_cmd(tmp_path, "--no-report"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    runs_dir = tmp_path / "out" / "s" / "runs"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(runs_dir.glob("*.json"))) < 3:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    before = {p.name: p.stat().st_mtime_ns for p in runs_dir.glob("*.json")}
    assert 3 <= len(before) < 12
    assert not [p for p in psutil.process_iter(["cmdline"]) if "paretopipe.worker" in " ".join(p.info["cmdline"] or [])
                and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    resumed = subprocess.run(_sweep_cmd(tmp_path, "--resume", "--no-report"), capture_output=True, text=True,
                             cwd=ROOT, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in runs_dir.glob("*.json")}
    assert len(after) == 12
    assert all(after[name] == mtime for name, mtime in before.items())  # done runs were not redone
    assert len(pd.read_csv(tmp_path / "out" / "s" / "runs.csv")) == 12


def test_stage_killed_mid_sweep_is_recorded_and_the_rest_completes(tmp_path):
    proc = subprocess.Popen(_sweep_cmd(tmp_path, "--no-report"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sweeper = psutil.Process(proc.pid)
    runs_dir = tmp_path / "out" / "s" / "runs"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(runs_dir.glob("*.json"))) < 2:
        time.sleep(0.2)
    workers = [c for c in sweeper.children(recursive=True) if "stage2" in " ".join(c.cmdline())]
    assert workers, "no stage 2 worker found"
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
    proc = subprocess.run([PYTHON, "automated_split_tester.py", "--env-file", str(env_file), "--model", "mobilenetv2",
                           "--splits", "0,5", "--profiles", "lan", "--runs", "1", "--batch-size", "1",
                           "--num-batches", "3", "--warmup", "1", "--link", "emulated", "--threads", "1",
                           "--out", str(tmp_path / "out"), "--session", "r", "--no-report", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
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
    proc = subprocess.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "2",
                           "--network", "3g", "--runs", "1", "--batch-size", "8", "--num-batches", "1", "--warmup", "0",
                           "--drift-every", "0", "--out", str(tmp_path), "--session", "s", "--local", "--quiet",
                           "--no-report"], capture_output=True, text=True, cwd=ROOT, timeout=600)
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
    proc = subprocess.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "2,19",
                           "--network", "3g", "--runs", "1", "--batch-size", "8", "--num-batches", "2", "--warmup", "0",
                           "--max-batch-s", "5", "--drift-every", "0", "--order", "sequential", "--out", str(tmp_path),
                           "--session", "s", "--local", "--quiet"], capture_output=True, text=True, cwd=ROOT,
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
