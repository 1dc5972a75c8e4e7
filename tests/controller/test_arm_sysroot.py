"""The aarch64 sysroot's build resumes only from whole steps: a debootstrap or a torch install that
was interrupted is found so (its completion marker missing) and done again, and a sysroot made
before the markers counts as whole when it is. Real files in a scratch ARM_CACHE; the build itself
(debootstrap, qemu) is make lab-arm's."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import ROOT


def state(cache) -> str:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "arm_sysroot.sh"), "state"], capture_output=True, text=True,
                          env={**os.environ, "ARM_CACHE": str(cache)}, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def python3(rootfs) -> None:
    (rootfs / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (rootfs / "usr" / "bin" / "python3").write_text("#!/bin/sh\n")
    (rootfs / "usr" / "bin" / "python3").chmod(0o755)


def test_a_missing_sysroot_is_built(tmp_path):
    assert state(tmp_path) == "rootfs missing, site missing"


def test_a_debootstrap_interrupted_after_it_installed_python3_is_built_again(tmp_path):
    rootfs = tmp_path / "rootfs"
    python3(rootfs)
    (rootfs / "debootstrap").mkdir()  # the second stage removes it as its last act: it did not finish
    assert state(tmp_path).startswith("rootfs interrupted")
    assert not (rootfs / ".paretopipe-rootfs-complete").exists()


@pytest.mark.parametrize("whole", [True, False])
def test_a_sysroot_from_before_the_markers_is_whole_when_debootstrap_finished_it(tmp_path, whole):
    rootfs = tmp_path / "rootfs"
    python3(rootfs)
    site = rootfs / "opt" / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.9.1'\n")
    if whole:
        (site / "numpy").mkdir()
        (site / "PIL").mkdir()
    got = state(tmp_path)
    assert got.startswith("rootfs complete") and (rootfs / ".paretopipe-rootfs-complete").is_file()
    # a site that lacks its dependencies was interrupted: setup installs it again
    assert got.endswith("site complete" if whole else "site interrupted")
    assert (site / ".paretopipe-site-complete").is_file() == whole
