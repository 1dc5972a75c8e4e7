"""Experiment files: a sweep from a file equals the same sweep from flags; sessions store their
resolved experiment; --rerun repeats it; --resume refuses changed options by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import PYTHON, ROOT
import tcp_helpers as cli

FILE = """
[sweep]
models = ["resnet18"]
splits = [0, 8]
networks = ["lan", "slow"]
runs = 1
batch_size = 1
num_batches = 3
warmup = 1
local = true
drift_every = 0

[networks.slow]
rate_up = "40mbit"
rate_down = "80mbit"
delay = "2ms"
"""
FLAGS_PROFILES = """
[lan]
comment = "Loopback or a switched gigabit LAN: no shaping at all."
[slow]
rate_up = "40mbit"
rate_down = "80mbit"
delay = "2ms"
"""
SAME_AS_FILE = ["--model", "resnet18", "--splits", "0,8", "--network", "lan,slow", "--runs", "1",
                "--batch-size", "1", "--num-batches", "3", "--warmup", "1", "--local",
                "--drift-every", "0"]


def _sweep(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return cli.run([PYTHON, "-m", "paretopipe", "sweep", "--quiet", "--no-report", *args], cwd=cwd, timeout=600)


def _configs(session) -> pd.DataFrame:
    summary = pd.read_csv(session / "summary.csv")
    return summary[["model", "backend", "network", "batch_size", "split_index", "runs"]].sort_values(
        ["network", "split_index"]).reset_index(drop=True)


@pytest.mark.slow
def test_file_equals_flags_then_rerun_and_resume_refusal(tmp_path):
    (tmp_path / "exp.toml").write_text(FILE)
    (tmp_path / "profiles.toml").write_text(FLAGS_PROFILES)
    out = tmp_path / "out"
    by_file = _sweep("--config", str(tmp_path / "exp.toml"), "--out", str(out), "--session", "file")
    assert by_file.returncode == 0, by_file.stderr[-1500:]
    by_flags = _sweep(*SAME_AS_FILE, "--network-file", str(tmp_path / "profiles.toml"), "--out", str(out),
                      "--session", "flags")
    assert by_flags.returncode == 0, by_flags.stderr[-1500:]
    # The same configurations, and the same resolved experiment (networks written out exactly).
    pd.testing.assert_frame_equal(_configs(out / "file"), _configs(out / "flags"))
    assert (out / "file" / "experiment.toml").read_text() == (out / "flags" / "experiment.toml").read_text()
    meta_file = json.loads((out / "file" / "session.json").read_text())
    meta_flags = json.loads((out / "flags" / "session.json").read_text())
    assert meta_file["networks"] == meta_flags["networks"]
    assert meta_file["networks"]["slow"]["up"]["rate_mbit_per_s"] == 40
    assert meta_file["networks"]["slow"]["down"]["rate_mbit_per_s"] == 80

    # A flag overrides the file.
    dry = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--config", str(tmp_path / "exp.toml"), "--runs", "3",
                   "--dry-run"], timeout=120)
    assert dry.returncode == 0 and dry.stdout.startswith("12 runs locally"), dry.stdout + dry.stderr

    # --rerun repeats the stored experiment as a new session.
    rerun = _sweep("--rerun", str(out / "file"), "--out", str(out), "--session", "again", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-1500:]
    pd.testing.assert_frame_equal(_configs(out / "file"), _configs(out / "again"))
    assert (out / "again" / "experiment.toml").read_text() == (out / "file" / "experiment.toml").read_text()

    # --resume with a changed option is refused, naming it; the session is left as it was.
    before = (out / "file" / "session.json").read_text()
    refused = _sweep("--out", str(out), "--session", "file", "--resume", "--batch-size", "2", "--runs", "2")
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "batch_size: session has 1, now 2" in lines[0] and "runs: session has 1, now 2" \
        in lines[0] and "--force-resume" in lines[0], refused.stderr
    assert (out / "file" / "session.json").read_text() == before
    # Without changes it resumes (nothing left to run) from the stored experiment alone.
    resumed = _sweep("--out", str(out), "--session", "file", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert len(pd.read_csv(out / "file" / "runs.csv")) == 4


@pytest.mark.parametrize("text, message", [
    ("[sweep]\nbatch_sizes = 4\n", "unknown option 'batch_sizes' in [sweep]; valid:"),
    ("[sweep]\nbatch_size = 0\n", "'0' is out of range"),
    ("[sweep]\nbackend = \"grpc\"\n", "'grpc' is not one of tcp, rpc, both"),
    ("[sweeps]\n", "unknown table [sweeps]"),
    ("[sweep\n", "is not valid TOML"),
    ("[hosts]\nlist = [{address = \"10.0.0.1\"}]\n", "names one host"),
    ("[hosts]\nsecret = \"abc\"\n", "unknown key 'secret'"),
    ("[networks.x]\nrate = \"10mbps\"\n[sweep]\nnetworks = [\"x\"]\n", "bytes per second"),
])
def test_bad_experiment_files_get_one_line(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--config", str(path), "--dry-run"], timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_shipped_examples_parse(root):
    for name in ("demo.toml", "pi-gpu.toml"):
        proc = subprocess.run([sys.executable, "-m", "paretopipe", "sweep", "--config", str(root / "examples" / name),
                               "--dry-run"], capture_output=True, text=True, cwd=root, timeout=120)
        assert proc.returncode == 0, (name, proc.stderr)
        assert " runs " in proc.stdout.splitlines()[0]
    demo = subprocess.run([sys.executable, "-m", "paretopipe", "sweep", "--config", str(root / "examples/demo.toml"),
                           "--dry-run"], capture_output=True, text=True, cwd=root, timeout=120)
    assert "networks lan, wifi, lte" in demo.stdout


@pytest.mark.slow
def test_breakdown_parts_add_up_to_the_mean_latency(tmp_path):
    """The breakdown figure stacks per-batch means; transfer is latency minus every measured part,
    so the stack reaches the mean latency exactly, queueing included (issue: 46 of 133 ms drawn)."""
    from paretopipe.analysis import plotting

    proc = _sweep("--model", "mobilenetv2", "--splits", "0,10", "--network", "lan", "--runs", "1", "--batch-size", "1",
                  "--num-batches", "6", "--warmup", "1", "--in-flight", "4", "--local", "--out", str(tmp_path),
                  "--session", "s")
    assert proc.returncode == 0, proc.stderr[-1500:]
    summary = pd.read_csv(tmp_path / "s" / "summary.csv")
    parts = plotting.breakdown_parts(summary)
    stacked = sum(values for _, _, values in parts)
    assert stacked == pytest.approx(summary["latency_mean_s"].to_numpy(), rel=1e-9)
    by_label = {label: values for label, _, values in parts}
    k0 = summary.index[summary["split_index"] == 0][0]
    # At k=0 with four batches in flight, batches wait for stage 2: the part that was missing.
    assert by_label["queueing (waiting for a later stage)"][k0] > 0
