"""scripts/gpu_testbed.sh --rehearse, the GPU testbed's script run here with stage 2 on the CPU: an
emulated Raspberry Pi 4 calibrated from a published figure, image and real language-model sweeps,
and the one-page summary (paretopipe.analysis.gpu_testbed, paretopipe.controller.pi_calibration)."""

from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest

from conftest import PYTHON, ROOT, cgroups_missing
from tcp_helpers import run as tcp_run
from paretopipe.errors import UsageError
from paretopipe.analysis import gpu_testbed


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(cgroups_missing() is not None, reason=f"no usable cgroup cpu controller: {cgroups_missing()}")
def test_the_rehearsal_calibrates_a_pi_sweeps_both_workloads_and_summarises(tmp_path):
    out = tmp_path / "testbed"
    proc = subprocess.run(["bash", "scripts/gpu_testbed.sh", str(out), "--rehearse"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calibration = json.loads((out / "calibration.json").read_text())
    assert 0.02 <= calibration["share"] <= 1 and "realtime_rpi" in calibration["source"]
    if calibration["share"] < 1:  # the share makes ResNet-18 take the Pi's 100.3 ms
        assert calibration["emulated_resnet18_s"] == pytest.approx(0.1003, rel=1e-3)
    images = pd.read_csv(next(out.glob("images/*/report/pareto.csv")))
    assert set(images["split_index"]) == {0, 12} and set(images["network"]) == {"lan", "lte"}
    assert images.groupby("network")["knee"].sum().eq(1).all()  # one knee per network
    llm = pd.read_csv(next(out.glob("llm/*/report/pareto.csv")))
    assert set(llm["split_index"]) == {0, 15} and llm["tpot_median_s"].gt(0).all()
    summary = (out / "summary.md").read_text()
    assert f"held to a CPU share of {calibration['share']:.3f}" in summary
    assert "| mobilenet_v2 | lan |" in summary and "| smollm2-135m-instruct | lan | 15 |" in summary
    assert "n/a (no NVML)" in summary  # no GPU here: nothing measured, and the summary says so
    assert f"stage 1 held to {calibration['share']} of a core" in proc.stdout


def test_a_folder_without_sessions_is_one_line(tmp_path, capsys):
    with pytest.raises(UsageError, match="no sweep sessions with a report"):
        gpu_testbed.summary(tmp_path)
    bad = subprocess.run(["bash", "scripts/gpu_testbed.sh", str(tmp_path), "--fast"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --fast: the only option is --rehearse (stage 2 on " \
                                                        "CPU, fewer splits)"


def test_the_yardstick_is_one_line_of_mobilenetv2s_time_on_one_thread():
    # In a process of its own (forked where it can be): it sets torch's threads, this process's too.
    done = tcp_run([PYTHON, "-m", "paretopipe.controller.pi_calibration", "--yardstick"], cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"yardstick: MobileNetV2 takes \d+\.\d ms an image on one thread here\n", done.stdout), \
        done.stdout + done.stderr


def test_the_calibration_line_says_when_this_core_is_no_faster_than_the_pi():
    base = {"pi4_resnet18_s": 0.1003, "source": "the tutorial", "emulated_mobilenet_v2_s": 0.033}
    held = gpu_testbed._calibration_line({**base, "share": 0.5, "emulated_resnet18_s": 0.1003})
    assert "held to a CPU share of 0.500, at which ResNet-18 takes 100.3 ms, the Pi's published 100.3 ms" in held
    slow = gpu_testbed._calibration_line({**base, "share": 1.0, "emulated_resnet18_s": 0.1412})
    assert "no faster than a Pi 4 (ResNet-18 takes 141.2 ms here against the Pi's published 100.3 ms)" in slow
    assert "MobileNetV2 then takes 33.0 ms" in slow


def test_the_server_gpus_energy_is_printed_where_nvml_measured_it_and_below_idle_is_said():
    """Three lan rows of the 2026-11-30 H200 run: stage 2's NVML energy per image (the whole
    pipeline's energy_per_image_j stays empty there, since stage 1's CPU has no sensor)."""
    table = pd.DataFrame({
        "model": ["mobilenet_v2"] * 3, "network": ["lan"] * 3, "split_index": [0, 1, 2], "knee": [True, False, False],
        "latency_median_s": [0.005926, 0.006926, 0.009345], "stage2_compute_median_s": [0.004535, 0.004195, 0.005185],
        "energy_per_image_j": [float("nan")] * 3, "stage2_energy_per_image_j": [0.608128, 0.056346, float("nan")],
        "stage2_energy_below_idle": [False, False, True], "stage2_energy_window_s": [0.070075, 0.025662, 0.033983]})
    lines = gpu_testbed.image_section(table)
    assert "| mobilenet_v2 | 0 | 5.9 | 77% | 0.608 |" in lines and "| mobilenet_v2 | 2 | 9.3 | 55% | below idle |" in lines
    assert lines[-1].startswith("Each energy figure is one window of NVML's total-energy counter, 26 to 70 ms; 1 of 3 "
                                "drew less than the idle")
