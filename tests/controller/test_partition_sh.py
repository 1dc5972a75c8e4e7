"""partition.sh against a real sshd on 127.0.0.1 with a throwaway key pair; both hosts are 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
import subprocess

import psutil
import pytest

from conftest import ROOT, sshd_env_file


def test_partition_sh_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (make test installs it as root)")
    for script in ("partition.sh", "netem/lab.sh", "scripts/install_sysdeps.sh", "scripts/build_llamacpp.sh"):
        out = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_partition_sh_needs_hosts(tmp_path):
    out = subprocess.run(["bash", "partition.sh", "--env-file", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                              if k not in ("PI1_IP", "PI2_IP", "GPU_IP")})
    assert out.returncode == 2 and "set PI1_IP and PI2_IP" in out.stderr and out.stderr.count("\n") == 1


def test_partition_sh_over_real_ssh(sshd, tmp_path):
    env_file = sshd_env_file(sshd, tmp_path)
    out_dir = tmp_path / "results"
    proc = subprocess.run(["bash", "partition.sh", "--env-file", str(env_file), "--model", "resnet18",
                           "--batch-size", "1", "--num-batches", "2", "--warmup", "1", "--out", str(out_dir),
                           "0", "4"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(out_dir.glob("*/runs/*.json"))
    assert len(runs) == 2
    recs = [json.loads(p.read_text()) for p in runs]
    assert sorted(r["config"]["split_index"] for r in recs) == [0, 4]
    assert all(r["status"] == "complete" for r in recs)
    # Nothing left running: the stages it started through this sshd are gone (SSH_CONNECTION names
    # its port; other tests' stages may be running beside this one).
    assert not _stages_started_through(sshd[0])


def test_partition_sh_sweeps_a_language_model_over_real_ssh(sshd, tmp_path):
    """The same face, a language model: its generation runs on the two hosts over SSH, a record per split."""
    env_file = sshd_env_file(sshd, tmp_path)
    out_dir = tmp_path / "results"
    proc = subprocess.run(["bash", "partition.sh", "--env-file", str(env_file), "--model", "tiny-lm", "--out",
                           str(out_dir), "0", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*/runs/*.json"))]
    assert sorted(r["config"]["split_index"] for r in recs) == [0, 3]
    assert all(r["status"] == "complete" and r["summary"]["tpot_median_s"] > 0 for r in recs)
    assert not _stages_started_through(sshd[0])


def _stages_started_through(port: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "paretopipe.controller.worker" not in " ".join(proc.info["cmdline"] or []):
            continue
        try:
            conn = proc.environ().get("SSH_CONNECTION", "").split()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if conn[3:4] == [str(port)]:
            found.append(proc.pid)
    return found


@pytest.mark.parametrize("args, message", [
    (["--model", "x' if __import__('os').system('touch F') else 'mobilenetv2"], "unknown model"),
    (["99"], "split index 99 out of range"),
    (["5", "x;touch F"], "is not a block index"),
    (["--batch-size", "$(touch F)"], "is not a whole number"),
    (["--profile"], "needs a value"),
])
def test_partition_sh_takes_hostile_values_as_data(sshd, tmp_path, args, message):
    """Rows 10-13 of the attack table: values are arguments, never code or shell; bad ones exit 2."""
    env_file = sshd_env_file(sshd, tmp_path)
    proc = subprocess.run(["bash", "partition.sh", "--env-file", str(env_file), "--out", str(tmp_path / "out"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (ROOT / "F").exists() and not (tmp_path / "F").exists()


def test_hostile_env_values_never_reach_a_shell(sshd, tmp_path):
    """REMOTE_PYTHON, PORT and SSH_USER holding shell syntax or ssh options: refused or quoted."""
    base = sshd_env_file(sshd, tmp_path).read_text()
    for bad, message in (("SSH_USER=-oProxyCommand=touch%20F", "is not a user name"),
                         ("PORT=5555;touch F", "is not a TCP port"),
                         ("REMOTE_PYTHON=python3;touch F", "exited")):
        env_file = tmp_path / f"bad-{bad.split('=')[0]}.env"
        key = bad.split("=")[0]
        env_file.write_text("\n".join(line for line in base.splitlines() if not line.startswith(key + "=")) + f"\n{bad}\n")
        # --out: a sweep that fails on its hosts still starts a session, which belongs in tmp_path,
        # not in the checkout's results/ (where `make demo` would compare against it).
        proc = subprocess.run(["bash", "partition.sh", "--env-file", str(env_file), "--out", str(tmp_path / "out"),
                               "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode in (1, 2), proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not (ROOT / "F").exists() and not Path("/root/F").exists() and not (tmp_path / "F").exists()
