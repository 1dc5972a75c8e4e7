"""Shared fixtures: models are built and traced once per session (the slow part of the suite)."""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import pytest

# An OpenMP thread that waits for work sleeps rather than spins (read when torch loads libgomp, so
# before the import; the processes the tests start inherit it). The parallel pass runs four workers
# and their stages on two cores: a spinning thread takes a core that another test's work needs. Two
# processes of two torch threads each, side by side here, took 7.2 s of CPU each for what one took
# alone in 1.5 s; with passive waiting, 2.0 s each.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after OMP_WAIT_POLICY)

from paretopipe.controller.zygote import startup_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# Under pytest-xdist (make test runs two workers) each worker keeps to one thread: two workers of two
# threads each would oversubscribe this machine's two cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))

# A shell without job control starts background commands with SIGINT ignored, and children inherit
# that: the Ctrl-C tests' stages and sweeps would then never see their SIGINT (it failed two tests
# when pytest ran as `pytest ... &`). A handled signal resets to the default in each child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Nothing is fetched in the tests: a hub id resolves from the local Hugging Face cache only, and a
# torchvision weight name from torch's hub cache only (each refused in one line otherwise). The
# processes the tests start inherit both.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PARETOPIPE_OFFLINE", "1")
# Figures are drawn off screen, as on a headless machine matplotlib would choose anyway. Said once,
# here, because matplotlib reads it as it is imported: a command line given another value is not
# forked from the tests' zygote, which imported matplotlib (tcp_helpers.CLI_PRELOAD).
os.environ.setdefault("MPLBACKEND", "Agg")


#: make test checks a seeded sample of each exhaustive set (every cut of a large model: each is a
#: whole forward pass); make test-exhaustive, which .ci/run runs too, sets this and checks them all.
EXHAUSTIVE = os.environ.get("PARETOPIPE_EXHAUSTIVE") == "1"


def exhaustive_sample(items, k: int = 12, seed: int = 0) -> list:
    """``items`` whole under PARETOPIPE_EXHAUSTIVE=1 or when there are at most ``k``; else the first,
    the last and ``k - 2`` of the rest drawn with ``seed`` (the same sample on every run), in order."""
    items = list(items)
    if EXHAUSTIVE or len(items) <= k:
        return items
    import random

    middle = sorted(random.Random(seed).sample(range(1, len(items) - 1), k - 2))
    return [items[0], *(items[i] for i in middle), items[-1]]


@functools.lru_cache(maxsize=None)
def unexportable_model(folder: Path) -> str:
    """A model file whose block after the stem holds ``torch.cumprod``, an operator torch's ONNX
    exporter lacks at opset 17 (the engines' refusal); returns its ``--model`` name."""
    import textwrap

    path = folder / "cumnet.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        INPUT_SIZE = 32
        class Net(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
                self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, n))
            def forward(self, x):
                return self.head(torch.cumprod(torch.sigmoid(self.stem(x)), -1))
        def build(num_classes=10):
            return Net(num_classes)
    """))
    return f"{path}:build"


def traced(name: str, batch: int = 2, size: int | None = None):
    """(model, partitioner, inputs, other_inputs) for a zoo model at ``batch`` images of ``size``
    pixels a side (the model's own input size unless given)."""
    from paretopipe.partition import fxcuts, models

    model = models.build(name)
    size = size or models.input_size(name)
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(batch, 3, size, size, generator=gen)
    other = torch.randn(batch, 3, size, size, generator=gen)
    part = fxcuts.Partitioner(model, inputs, models.canonical_name(name))
    return model, part, inputs, other


def pytest_configure(config) -> None:
    """Each test's CPU, its processes' included, when PARETOPIPE_TEST_CPU names a folder (make test-cpu)."""
    import cpu_accounting

    config.pluginmanager.register(cpu_accounting, "cpu_accounting")


#: Fixtures that need root (namespaces, sshd on a port, mounts) or a namespace lab: their tests
#: carry the ``root``/``lab`` markers, so ``make test-fast`` leaves them out without a list to keep.
ROOT_FIXTURES = {"sshd", "small_disk", "namespace", "lab"}
LAB_FIXTURES = {"lab"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & LAB_FIXTURES:
            item.add_marker(pytest.mark.lab)
        if used & ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
    # The long tests start first, so that the parallel pass does not end waiting for one of them
    # (a stable sort, the same on every xdist worker).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _working_directory_kept():
    """A test that changes the working directory puts it back: the next test on this worker reads
    relative paths (``examples/``, a model file) from the checkout."""
    before = os.getcwd()
    yield
    assert os.getcwd() == before, f"the test left the working directory at {os.getcwd()}, not {before}"


def pytest_collection_finish(session) -> None:
    """The start-up environment each test begins with, and the tests' zygote's: as it stands once
    collection has imported every test module. A library may add to it then (scikit-learn's import
    sets ``KMP_DUPLICATE_LIB_OK`` and ``KMP_INIT_AT_FORK``)."""
    import gc

    import tcp_helpers

    tcp_helpers.STARTUP_ENV = startup_env(dict(os.environ))
    # Collection imported torch, transformers and every test module: objects that live as long as
    # the worker. Frozen, the worker's full collections no longer walk them (11 in 100 tests took
    # 2.0 s of a worker's 205 s of CPU); what a test makes is still collected.
    gc.freeze()


@pytest.fixture(autouse=True)
def _startup_environment_kept():
    """A variable read at interpreter start that a test, or a library it imported, changed is put
    back after the test: the worker's zygote forks only for the start-up environment it began with.
    OpenCV's import (a detector's transform) adds a LD_LIBRARY_PATH for its subprocesses, and every
    later command line on that worker started a fresh interpreter (51 in one pass, 28 of them the
    walkthrough's, each 4.5 s of CPU more than a fork)."""
    yield
    import tcp_helpers

    kept, now = tcp_helpers.STARTUP_ENV, startup_env(dict(os.environ))
    if kept is not None and now != kept:
        for key in set(now) - set(kept):
            del os.environ[key]
        os.environ.update(kept)


@pytest.fixture
def root() -> Path:
    return ROOT


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.lru_cache(maxsize=None)
def cgroups_missing() -> str | None:
    """Why no cgroup cpu controller can hold a stage to a share here (None: one can), for a
    ``--stage-cpu`` test's skip."""
    from paretopipe.compute import cpushare
    from paretopipe.errors import UsageError

    try:
        cpushare.Hierarchy.detect()
        cpushare.check_writable()
    except UsageError as exc:
        return str(exc)
    return None


@pytest.fixture(autouse=True)
def _no_orphans():
    """Whatever a test started is killed afterwards, pass or fail: no orphan ever eats the CPU."""
    yield
    import signal

    from tcp_helpers import STARTED

    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)


@pytest.fixture
def sshd(tmp_path):
    """A throwaway sshd on 127.0.0.1 (key auth only): yields (port, client key, known_hosts)."""
    import shutil
    import socket
    import subprocess
    import time

    from tcp_helpers import free_port

    sshd_bin = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd_bin) or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server not installed (make test installs it as root)")
    if not is_root():
        pytest.skip("a throwaway sshd logging in as this user needs root here")
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    os.makedirs("/run/sshd", exist_ok=True)
    port = free_port()
    config = tmp_path / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {keys / 'host'}
AuthorizedKeysFile {keys / 'authorized_keys'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {tmp_path / 'sshd.pid'}
""")
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.skip(f"sshd did not start: {proc.stderr.read()[-300:]}")
            time.sleep(0.2)
    yield port, keys / "client", tmp_path / "known_hosts"
    proc.terminate()
    proc.wait(10)




def sshd_env_file(sshd, tmp_path) -> Path:
    """A .env naming 127.0.0.1 as both hosts, reached through the ``sshd`` fixture's key and port."""
    from tcp_helpers import free_port

    port, key, known = sshd
    path = tmp_path / ".env"
    path.write_text(f"""PI1_IP=127.0.0.1
PI2_IP=127.0.0.1
SSH_USER={os.environ.get('USER') or 'root'}
SSH_KEY={key}
SSH_PORT={port}
SSH_KNOWN_HOSTS={known}
REMOTE_DIR={ROOT}
REMOTE_PYTHON={PYTHON}
PORT={free_port()}
""")
    return path
