"""The default weights are the same bits on every CPU: this machine's fingerprints of every zoo model
equal those recorded on aarch64 (a Raspberry Pi 4's Cortex-A72, under qemu-user, with PyPI's
aarch64 CPU build of torch 2.9.1), which the golden file holds (``make arm-fingerprints`` writes it;
the committed file joins two such runs: vgg16's, and the other seven's).

Before the portable initialisation (weight-cache INIT_VERSION 1), resnet18 was ff772d189c8424d2 on
x86 and a037984fc09be9b3 on aarch64, and a Pi and an x86 server refused each other's handshake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import EXHAUSTIVE, exhaustive_sample
from paretopipe.partition import models
from paretopipe.partition.names import DETECTORS
from paretopipe.partition import weightcache
from paretopipe.partition.weightcache import INIT_VERSION

GOLDEN = json.loads((Path(__file__).parent / "golden" / "fingerprints.json").read_text())


def test_the_golden_file_comes_from_a_pi_core_with_this_initialisation():
    # zoo_fingerprints.py runs with OMP_NUM_THREADS=1 (scripts/arm_sysroot.sh)
    assert GOLDEN["machine"] == "aarch64" and GOLDEN["qemu_cpu"] in ("cortex-a72", "cortex-a76")
    assert GOLDEN["init_version"] == INIT_VERSION
    assert set(GOLDEN["fingerprints"]) == set(models.NAMED_MODELS)


def _fingerprint_built_afresh_on_two_threads(name: str, monkeypatch) -> str:
    """``name``'s default weights built with the cache off and two torch threads (the golden
    values came from one thread, and the thread count changes calibration's summation order)."""
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return models.fingerprint(models.build(name))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("name", exhaustive_sample(models.NAMED_MODELS, k=3))
def test_default_weights_fingerprint_equals_aarch64(name, monkeypatch):
    """Built here and now (a cached copy proves nothing), in this process, with two threads: the golden
    file was built in another process with one thread, so this also proves that neither the process
    nor the thread count (which changes float summation order in calibration) moves a bit. Each
    build takes 1-9 s of CPU (VGG16 the most): ``make test`` builds a seeded sample (mobilenetv2, alexnet and
    vit_b_16: depthwise convolutions with batch norm, plain convolutions and linear layers,
    attention), ``make test-exhaustive`` all eight."""
    got = _fingerprint_built_afresh_on_two_threads(name, monkeypatch)
    assert got == GOLDEN["fingerprints"][name], (
        f"{name}: this {torch.__version__} build differs from aarch64's {GOLDEN['torch']}")


#: The detectors' default weights (names.DETECTORS), which the golden file leaves out (``make
#: arm-fingerprints`` writes it for the zoo). Recorded on x86 on 2026-12-02 (7f874f1, one thread,
#: the cache off: ``PARETOPIPE_CACHE_DIR=none python scripts/zoo_fingerprints.py NAME``). The two
#: torchvision detectors gave the same on aarch64 (``bash scripts/arm_sysroot.sh python
#: /opt/paretopipe/scripts/zoo_fingerprints.py NAME``: Faster R-CNN in 236 s under qemu, SSDlite in
#: 33 s); YOLOX was not built there, since its code (libreyolo) is not in the sysroot. Faster
#: R-CNN's is also what it was before its BatchNorm calibration ran through the body alone (6dd62e7).
DETECTOR_FINGERPRINTS = {"ssdlite320_mobilenet_v3_large": "01dbda7b95933adb",
                         "fasterrcnn_mobilenet_v3_large_fpn": "67ba582ebd9a9f2f",
                         "yolox_n": "694b225206182e19", "yolox_s": "3b58e2510522987f"}
#: The two that take about a second to build are checked in make test, all four in make test-exhaustive.
DETECTORS_IN_MAKE_TEST = ("ssdlite320_mobilenet_v3_large", "yolox_n")


@pytest.mark.parametrize("name", list(DETECTORS) if EXHAUSTIVE else DETECTORS_IN_MAKE_TEST)
def test_a_detectors_default_weights_fingerprint_equals_the_recorded_one(name, monkeypatch):
    """Built afresh with two threads, as the zoo's are above: a change to the draws or to the
    calibration (which runs a detector through its body alone when its heads hold no BatchNorm)
    that moved one bit of a detector's weights fails here."""
    assert set(DETECTOR_FINGERPRINTS) == set(DETECTORS)
    if name.startswith("yolox"):
        pytest.importorskip("libreyolo", reason="YOLOX needs libreyolo (paretopipe[detection])")
    assert _fingerprint_built_afresh_on_two_threads(name, monkeypatch) == DETECTOR_FINGERPRINTS[name]


def test_portable_draws_are_exact_arithmetic_on_pcg64():
    """The generator's first values, computed by hand from PCG64's raw output: a change of numpy
    or of the formula would move every weight."""
    import numpy as np

    raw = np.random.PCG64(np.random.SeedSequence([7, 11])).random_raw(3)
    want = [float(r >> np.uint64(11)) * 2.0 ** -52 - 1.0 for r in raw]
    got = models.portable_uniform((3,), 7, 11)
    assert got.dtype == torch.float64 and got.tolist() == want
    assert all(-1.0 <= v < 1.0 for v in want)
    assert not torch.equal(models.portable_uniform((3,), 7, "a"), models.portable_uniform((3,), 7, "b"))
