"""The built wheel, installed into a scratch folder, works from outside the repository: the
console script, package data (profiles.toml, the run schema) and a two-stage sweep whose worker
processes import the installed package, not this checkout."""

from __future__ import annotations

import pytest

import os
import subprocess

import pandas as pd

from conftest import PYTHON, ROOT


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([PYTHON, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(wheels.glob("paretopipe-*.whl"))
    site = tmp_path / "site"
    install = subprocess.run([PYTHON, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    # The scratch folder comes first on the path; the checkout is nowhere near the working folder.
    env = {**os.environ, "PYTHONPATH": str(site)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([PYTHON, "-c", "import paretopipe, paretopipe.network.conditions as c; "
                            "print(paretopipe.__file__); print(c.default_file())"],
                           capture_output=True, text=True, cwd=work, env=env, check=True).stdout.split()
    assert all(p.startswith(str(site)) for p in where), where
    script = site / "bin" / "paretopipe"
    for argv in ([str(script), "--help"], [PYTHON, "-m", "paretopipe", "--version"]):
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=env, timeout=120)
        assert proc.returncode == 0, (argv, proc.stderr)
    listed = subprocess.run([str(script), "split", "--model", "resnet18", "--list"], capture_output=True, text=True,
                            cwd=work, env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split()[:3] == ["k", "block", "cut"] and "layer4" in listed.stdout
    swept = subprocess.run([str(script), "sweep", "--model", "resnet18", "--splits", "0,5", "--network", "lan,wifi",
                            "--runs", "1", "--batch-size", "1", "--num-batches", "2", "--warmup", "0", "--local",
                            "--drift-every", "0", "--quiet", "--out", "results", "--session", "s"],
                           capture_output=True, text=True, cwd=work, env=env, timeout=900)
    assert swept.returncode == 0, swept.stderr[-2000:]
    runs = pd.read_csv(work / "results" / "s" / "runs.csv")
    assert len(runs) == 4 and set(runs["status"]) == {"complete"}
    assert (work / "results" / "s" / "report" / "pareto.csv").is_file()
    assert (work / "results" / "s" / "experiment.toml").is_file()
