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

from conftest import exhaustive_sample
from paretopipe.partition import models
from paretopipe.partition import weightcache
from paretopipe.partition.weightcache import INIT_VERSION

GOLDEN = json.loads((Path(__file__).parent / "golden" / "fingerprints.json").read_text())


def test_the_golden_file_comes_from_a_pi_core_with_this_initialisation():
    # zoo_fingerprints.py runs with OMP_NUM_THREADS=1 (scripts/arm_sysroot.sh)
    assert GOLDEN["machine"] == "aarch64" and GOLDEN["qemu_cpu"] in ("cortex-a72", "cortex-a76")
    assert GOLDEN["init_version"] == INIT_VERSION
    assert set(GOLDEN["fingerprints"]) == set(models.NAMED_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("name", exhaustive_sample(models.NAMED_MODELS, k=3))
def test_default_weights_fingerprint_equals_aarch64(name, monkeypatch):
    """Built here and now (a cached copy proves nothing), in this process, with two threads: the golden
    file was built in another process with one thread, so this also proves that neither the process
    nor the thread count (which changes float summation order in calibration) moves a bit. Each
    build takes 1-9 s of CPU (VGG16 the most): ``make test`` builds a seeded sample (mobilenetv2, alexnet and
    vit_b_16: depthwise convolutions with batch norm, plain convolutions and linear layers,
    attention), ``make test-exhaustive`` all eight."""
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = models.fingerprint(models.build(name))
    finally:
        torch.set_num_threads(threads)
    assert got == GOLDEN["fingerprints"][name], (
        f"{name}: this {torch.__version__} build differs from aarch64's {GOLDEN['torch']}")


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
