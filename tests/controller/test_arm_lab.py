"""A Pi's architecture in the lab: host 1 runs its stages on aarch64 (qemu-user with a Cortex-A72,
in a debootstrap sysroot), with this project pip-installed there from a wheel built here
(``make lab-arm``); host 2 is this x86 machine. Stage 1 on the "Pi", stage 2 on x86, over SSH with
real tc, both backends.

These run in ``make test-arm`` (``.ci/run`` calls it after ``make test``), not in ``make test``:
under qemu a stage is about 100x slower, and the sysroot takes minutes to build. Timings under
qemu mean nothing; correctness, weights and the install path do."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import PYTHON, ROOT
from lab_helpers import in_host, lab

pytestmark = [pytest.mark.arm, pytest.mark.root, pytest.mark.lab]

MODEL = "mobilenetv2"
#: Logits of the split pipeline (NEON kernels on stage 1, AVX2 on stage 2) against the unsplit model
#: on x86, on identical inputs and identical weights: only the order of float32 sums differs. The
#: unsplit model on aarch64 and on x86 differ by at most 1.6e-5 on these inputs (logits up to 6.0),
#: so the bound leaves a factor of 6.
CROSS_ARCH_ATOL = 1e-4
SLOW = '[slow]\nrate = "20mbit"\ncomment = "rate only: htb shapes it on any kernel"\n'


def _sysroot_missing() -> str | None:
    from paretopipe.controller import lab as labs

    if not os.access(labs.arm_python(), os.X_OK):
        return f"no aarch64 sysroot here ({labs.arm_python()}): `make lab-arm` builds it, and `make test-arm` runs it"
    return None


@pytest.fixture(scope="module")
def arm_lab():
    why = _sysroot_missing()
    if why:
        pytest.skip(why)
    with lab("pparm", 2, subnet=62, arches=["aarch64", "native"]) as made:
        yield made


def _rootfs_path(inside: str) -> Path:
    from paretopipe.controller import lab as labs

    return labs.arm_python().parents[1] / "rootfs" / inside.lstrip("/")


def test_the_lab_env_gives_the_aarch64_host_its_sysroot_python(arm_lab):
    from paretopipe.envfile import read_env
    from paretopipe.controller import lab as labs
    from paretopipe.controller.hosts import Testbed

    tb = Testbed.from_env(read_env(str(arm_lab.env_file)))
    assert [h.remote_python for h in tb.hosts] == [str(labs.arm_python()), PYTHON]
    answer = subprocess.run(tb.hosts[0].ssh() + [tb.hosts[0].shell_line("platform", [])], capture_output=True,
                            text=True, timeout=300)
    assert answer.returncode == 0, answer.stderr[-2000:]
    assert "aarch64" in answer.stdout  # python -m platform, run over SSH in the lab host


def test_doctor_shows_each_architecture_and_the_same_weights_and_cuts(arm_lab):
    ok = subprocess.run([PYTHON, "-m", "paretopipe", "doctor", "--env-file", str(arm_lab.env_file), "--model", MODEL],
                        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert ok.returncode == 0, ok.stdout + ok.stderr[-3000:]
    lines = ok.stdout.splitlines()
    header = lines[0].split()
    rows = {r.split()[0]: dict(zip(header, r.split())) for r in lines[1:3]}
    pi, server = rows[arm_lab.address(1)], rows[arm_lab.address(2)]
    assert (pi["arch"], pi["build"], pi["weights"], pi["digest"], pi["tc"]) == ("aarch64", "cpu", "same", "same", "ok")
    assert server["arch"] == "x86_64" and server["weights"] == "same"


def test_mixed_architecture_sweep_over_ssh_with_tc_on_both_backends(arm_lab, tmp_path):
    (tmp_path / "nets.toml").write_text(SLOW)
    proc = subprocess.run([PYTHON, "automated_split_tester.py", "--env-file", str(arm_lab.env_file), "--model", MODEL,
                           "--splits", "4,12", "--backend", "both", "--network-file", str(tmp_path / "nets.toml"),
                           "--network", "slow", "--link", "tc", "--runs", "1", "--batch-size", "1",
                           "--num-batches", "3", "--warmup", "1", "--threads", "1", "--drift-every", "0",
                           "--out", str(tmp_path / "out"), "--session", "s", "--no-report", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert sorted(zip(runs["backend"], runs["split_index"].astype(int))) == [("rpc", 4), ("rpc", 12), ("tcp", 4),
                                                                              ("tcp", 12)]
    assert set(runs["status"]) == {"complete"} and set(runs["link_mode"]) == {"tc"}
    for name in runs["json"]:
        stages = {s["role"]: s for s in json.loads((session / name).read_text())["manifest"]["stages"]}
        assert "aarch64" in stages["stage1"]["platform"]
        assert "x86_64" in stages["stage2"]["platform"]
        assert stages["stage1"]["weights_fingerprint"] == stages["stage2"]["weights_fingerprint"]
        assert stages["stage1"]["torch"].endswith("+cpu")  # the Pi's CPU build, not PyPI's CUDA default
    for i in (1, 2):  # tc cleared on both hosts afterwards
        assert "htb" not in in_host(arm_lab, i, "tc", "qdisc", "show", "dev", "eth0").stdout


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_split_outputs_across_architectures_equal_the_unsplit_model(arm_lab, tmp_path, engine):
    """partition1.py on the aarch64 host and partition2.py on x86, started over SSH as a user would
    on a Pi and a server; the logits stage 1 saves equal the unsplit model's on x86. The inputs are
    the `photos` set, bit-identical on both architectures (torch's seeded Gaussian is not). Under
    ONNX Runtime each host exports its own stage and runs it on its own architecture's build."""
    from paretopipe.envfile import read_env
    from paretopipe.partition import models
    from paretopipe.controller.hosts import Testbed
    from paretopipe.transport import inputs as data

    env_file = read_env(str(arm_lab.env_file))
    tb = Testbed.from_env(env_file)
    pi, server = tb.hosts
    secret = env_file["PARETOPIPE_SECRET"]
    saved = f"/tmp/arm-outputs-{os.getpid()}.npz"  # inside the sysroot
    common = ["--model-name", MODEL, "--split-index", "8", "--port", str(tb.data_port), "--batch-size", "2",
              "--threads", "1", "--connect-timeout", "600"]
    env = {"PARETOPIPE_SECRET": secret}
    stage1 = subprocess.Popen(pi.argv("paretopipe", ["stage1", *common, "--host", pi.address, "--dataset", "photos",
                                                     "--num-batches", "2", "--warmup", "1", "--save-outputs", saved,
                                                     "--engine", engine, "--out", "/tmp"], env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    stage2 = subprocess.run(server.argv("paretopipe", ["stage2", *common, "--host", pi.address,
                                                       "--output-dir", str(tmp_path)], env),
                            capture_output=True, text=True, timeout=1200)
    _, err = stage1.communicate(timeout=600)
    assert stage2.returncode == 0 and stage1.returncode == 0, stage2.stderr[-2000:] + err[-2000:]
    logits = np.load(_rootfs_path(saved), allow_pickle=False)["logits"]
    _rootfs_path(saved).unlink()
    model = models.build(MODEL, num_classes=10).eval()
    with torch.no_grad():
        ref = torch.stack([model(x) for x in data.batches("photos", 2, models.input_size(MODEL), 3)]).numpy()
    assert logits.shape == ref.shape == (3, 2, 10)  # every batch, the warm-up one included
    assert np.abs(logits - ref).max() <= CROSS_ARCH_ATOL
    if engine != "torch":  # each host ran its stage under ONNX Runtime: stage 1 on aarch64, stage 2 on x86
        records = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
        stages = next(r for r in records if "manifest" in r)["manifest"]["stages"]
        assert [s["engine"]["engine"] for s in stages] == ["onnxruntime", "onnxruntime"]
        assert "aarch64" in stages[0]["platform"] and "x86_64" in stages[1]["platform"]
        assert max(s["engine"]["max_rel_error"] for s in stages) < CROSS_ARCH_ATOL


def test_a_language_model_split_across_architectures_generates_the_unsplit_models_tokens(arm_lab, tmp_path):
    """tiny-lm's stage 1 (embedding and two layers) on the aarch64 host, the rest on x86, over SSH
    as a user would start them: the greedy tokens equal the unsplit model's on x86, and both
    stages built their own blocks from the same portable generator (the handshake compares it)."""
    from paretopipe.envfile import read_env
    from paretopipe.llm import build, generate, prompts
    from paretopipe.controller.hosts import Testbed

    env_file = read_env(str(arm_lab.env_file))
    tb = Testbed.from_env(env_file)
    pi, server = tb.hosts
    env = {"PARETOPIPE_SECRET": env_file["PARETOPIPE_SECRET"]}
    saved = f"/tmp/arm-lm-{os.getpid()}.npz"  # inside the sysroot
    common = ["--model", "tiny-lm", "--port", str(tb.data_port), "--threads", "1", "--connect-timeout", "900"]
    stage1 = subprocess.Popen(pi.argv("paretopipe", ["stage1", *common, "--host", pi.address, "--split", "3",
                                                     "--prompt-len", "12", "--gen-tokens", "6", "--warmup", "0",
                                                     "--save-outputs", saved, "--out", "/tmp"], env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Its record goes to this test's folder: the x86 host's REMOTE_DIR is the checkout itself.
    stage2 = subprocess.run(server.argv("paretopipe", ["stage2", *common, "--host", pi.address, "--output-dir",
                                                       str(tmp_path)], env),
                            capture_output=True, text=True, timeout=1800)
    out, err = stage1.communicate(timeout=900)
    assert stage2.returncode == 0 and stage1.returncode == 0, stage2.stderr[-2000:] + err[-2000:]
    got = np.load(_rootfs_path(saved), allow_pickle=False)["tokens"].tolist()
    _rootfs_path(saved).unlink()
    src = build.source("tiny-lm")
    want = generate.generate_unsplit(generate.reference_model(src), prompts.seeded_prompt(12, 260, 0, 0), 6)[0]
    assert got == [want]


def test_a_loadgen_scenario_runs_on_the_aarch64_data_source(arm_lab, tmp_path):
    """LoadGen on the "Pi": the sysroot built it from its source distribution (PyPI has no aarch64
    wheel; ``make lab-arm`` installs g++ and python3-dev and pip-builds it as a Pi user would), and
    stage 1 there drives a SingleStream test through stage 2 on x86, keeping LoadGen's logs."""
    from paretopipe.envfile import read_env
    from paretopipe.controller.hosts import Testbed

    env_file = read_env(str(arm_lab.env_file))
    pi, server = Testbed.from_env(env_file).hosts
    env = {"PARETOPIPE_SECRET": env_file["PARETOPIPE_SECRET"]}
    port = str(Testbed.from_env(env_file).data_port)
    out = f"/tmp/arm-loadgen-{os.getpid()}"  # inside the sysroot
    common = ["--model", MODEL, "--split", "0", "--port", port, "--threads", "1", "--connect-timeout", "600"]
    stage1 = subprocess.Popen(pi.argv("paretopipe", ["stage1", *common, "--host", pi.address, "--batch-size", "1",
                                                     "--warmup", "1", "--scenario", "singlestream", "--min-duration-s",
                                                     "3", "--min-query-count", "8", "--out", out], env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stage2 = subprocess.run(server.argv("paretopipe", ["stage2", *common, "--host", pi.address,
                                                       "--output-dir", str(tmp_path)], env),
                            capture_output=True, text=True, timeout=1200)
    printed, err = stage1.communicate(timeout=900)
    assert stage2.returncode == 0 and stage1.returncode == 0, stage2.stderr[-2000:] + err[-2000:]
    folder = _rootfs_path(out)
    (record_path,) = folder.glob("*.json")
    record = json.loads(record_path.read_text())
    s = record["summary"]
    assert "aarch64" in record["manifest"]["stages"][0]["platform"]
    assert s["loadgen_scenario"] == "singlestream" and s["loadgen_queries"] >= 8 and s["loadgen_latency_p90_s"] > 0
    assert (record_path.with_name(record_path.stem + ".mlperf") / "mlperf_log_summary.txt").is_file()
    assert "LoadGen singlestream: p90" in printed
    subprocess.run(["rm", "-rf", str(folder)], check=False)
