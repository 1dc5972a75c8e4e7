"""The aarch64 sysroot's build resumes only from whole steps: a debootstrap or a torch install that
was interrupted is found so (its completion marker missing) and done again, and a sysroot made
before the markers counts as whole when it is. Real files in a scratch ARM_CACHE; the build itself
(debootstrap, qemu) is make lab-arm's."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

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


def test_the_wheels_sources_are_copied_whole_while_a_new_pycache_folder_appears_beside_them(tmp_path):
    """CI's lab-arm copy failed once ("tar: paretopipe: file changed as we read it"): the parallel
    tests create __pycache__ folders in the checkout while .ci/run builds the aarch64 wheel. Here a
    real folder appears in paretopipe/ while the copy's reading side is held back, as a busy
    machine's may be; the copy still holds every file and no bytecode."""
    repo, dest, gate = tmp_path / "repo", tmp_path / "dest", tmp_path / "gate"
    for folder in (repo / "scripts", repo / "paretopipe" / "sub" / "__pycache__", dest, gate / "bin"):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "arm_sysroot.sh", repo / "scripts")
    files = {"pyproject.toml": "[project]\n", "README.md": "# r\n", "paretopipe/__init__.py": "",
             "paretopipe/sub/big.py": "#" * (1 << 20)}  # more than a pipe holds: the reading tar blocks
    for name, text in files.items():
        (repo / name).write_text(text)
    (repo / "paretopipe" / "sub" / "__pycache__" / "big.cpython-311.pyc").write_bytes(b"\0")
    # The extracting tar waits for the test's word, so the archiving one blocks mid-folder.
    (gate / "bin" / "tar").write_text(f'#!/bin/sh\ncase "$*" in *-xf*) touch {gate}/waiting; '
                                      f'while [ ! -e {gate}/go ]; do sleep 0.05; done;; esac\n'
                                      f'exec {shutil.which("tar")} "$@"\n')
    (gate / "bin" / "tar").chmod(0o755)
    copy = subprocess.Popen(["bash", str(repo / "scripts" / "arm_sysroot.sh"), "sources", str(dest)],
                            env={**os.environ, "PATH": f"{gate / 'bin'}:{os.environ['PATH']}"},
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (gate / "waiting").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the archiving tar is into paretopipe/ by now, blocked on the full pipe
    (repo / "paretopipe" / "__pycache__").mkdir()
    (gate / "go").touch()
    _, err = copy.communicate(timeout=60)
    assert copy.returncode == 0, err
    copied = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert copied == set(files)
    assert all((dest / name).read_text() == text for name, text in files.items())
