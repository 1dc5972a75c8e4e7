"""partition.sh against a real sshd on 127.0.0.1 with a throwaway key pair; both hosts are 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, sshd_env_file


def test_partition_sh_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (make test installs it as root)")
    for script in ("partition.sh", "netem/lab.sh", "scripts/install_sysdeps.sh"):
        out = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_partition_sh_needs_hosts(tmp_path):
    out = subprocess.run(["bash", "partition.sh", "--env-file", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                              if k not in ("PI1_IP", "PI2_IP", "GPU_IP")})
    assert out.returncode == 2 and "set PI1_IP and PI2_IP" in out.stderr


def test_partition_sh_over_real_ssh(sshd, tmp_path):
    env_file = sshd_env_file(sshd, tmp_path)
    out_dir = tmp_path / "results"
    proc = subprocess.run(["bash", "partition.sh", "--env-file", str(env_file), "--model", "resnet18",
                           "--batch-size", "1", "--num-batches", "2", "--warmup", "1", "--out", str(out_dir),
                           "0", "4"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(out_dir.glob("*.json"))
    assert len(runs) == 2
    recs = [json.loads(p.read_text()) for p in runs]
    assert sorted(r["config"]["split_index"] for r in recs) == [0, 4]
    assert all(r["status"] == "complete" for r in recs)
    # Nothing left running: the stages it started are gone.
    left = subprocess.run(["pgrep", "-f", f"partition[12].py.*--port {env_file.read_text().split('PORT=')[-1].strip()}"],
                          capture_output=True, text=True)
    assert left.stdout.strip() == ""
