"""The doctor's per-host facts: architecture and torch build from the real host check, and the
warning for a CUDA build of torch on an ARM board that has no CUDA device."""

from __future__ import annotations

import json
import platform
import subprocess

import torch

from conftest import PYTHON, ROOT
from paretopipe.controller import doctor


def test_host_check_reports_architecture_and_torch_build():
    proc = subprocess.run([PYTHON, "-m", "paretopipe.controller.hostcheck"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["machine"] == platform.machine()
    assert got["torch_build"] == ("cuda" if torch.version.cuda else "cpu")


def test_a_cuda_build_on_a_pi_is_warned_about_and_a_jetson_or_server_is_not():
    pi = {"machine": "aarch64", "torch": "2.14.1+cu130", "torch_build": "cuda", "cuda_available": False}
    warning = doctor.cuda_build_warning("192.0.2.10", pi)
    assert warning and "CUDA build on an aarch64 host" in warning and "download.pytorch.org/whl/cpu" in warning
    assert doctor.cuda_build_warning("jetson", {**pi, "cuda_available": True}) is None
    assert doctor.cuda_build_warning("pi", {**pi, "torch_build": "cpu", "torch": "2.9.1+cpu"}) is None
    assert doctor.cuda_build_warning("server", {**pi, "machine": "x86_64"}) is None
    assert {"arch", "build"} <= set(doctor.COLUMNS)


def test_a_language_model_is_checked_by_its_identity_a_layers_weights_and_its_cut_table():
    from paretopipe.controller.hostcheck import HostcheckOptions

    argv = HostcheckOptions(models="tiny-lm,mobilenetv2", num_classes=10, port=5999).to_argv()
    proc = subprocess.run([PYTHON, "-m", "paretopipe.controller.hostcheck", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    from paretopipe.llm.build import source

    identity, layer = got["fingerprints"]["tiny-lm"].split("/")
    assert identity == source("tiny-lm").identity() and len(layer) == 16
    assert not got["cut_digests"]["tiny-lm"].startswith("error") and not got["fingerprints"]["mobilenetv2"].startswith("error")
    assert HostcheckOptions.parse(argv, "hostcheck", "") == HostcheckOptions(models="tiny-lm,mobilenetv2",
                                                                             num_classes=10, port=5999)
