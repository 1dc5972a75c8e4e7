"""What a node is: host, CPU, versions, the code's commit and digest, device (with CUDA and driver versions), threads."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from . import allocator
from .sourcefiles import source_files


STAMP = ".paretopipe-deploy.json"  # written next to the package by `--deploy`, where no .git exists


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    """The commit the package's code comes from: git's, or the stamp a deploy left."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return json.loads((here.parent / STAMP).read_text()).get("commit")
    except (OSError, ValueError, AttributeError):
        return None


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 (16 hex) of every source file of the package: equal exactly when the code is equal,
    with or without git (a dirty tree or a hand edit changes it)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cuda_versions(device: str) -> dict[str, Any]:
    """CUDA runtime and driver versions and the device's name, where a GPU is in use."""
    if not device.startswith("cuda"):
        return {"gpu_name": None, "cuda": None, "cuda_driver": None}
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "cuda": None, "cuda_driver": None}
    driver = None
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        pass
    return {"gpu_name": torch.cuda.get_device_name(torch.device(device)), "cuda": torch.version.cuda,
            "cuda_driver": driver}


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


_VERSION_LINE = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)


def _version(package: str) -> str | None:
    """A package's version: the loaded module's, or else read without importing it. The sweep's
    controller names torchvision this way instead of importing it (2.4 s of a sweep's start here,
    most of it torch._dynamo, which torchvision.models pulls in)."""
    module = sys.modules.get(package)
    if module is not None:
        return getattr(module, "__version__", None)
    # torch and torchvision keep the full version (with its +cu tag, as __version__ gives it) in
    # version.py; read it as text, since importing it would import the package.
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            found = _VERSION_LINE.search((Path(folder) / "version.py").read_text())
        except OSError:
            continue
        if found:
            return found.group(1)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def node_manifest(device: str = "cpu", threads: int | None = None, **extra: Any) -> dict[str, Any]:
    """What this node is: host, CPU, versions, git commit, device, threads (a node that has not
    loaded torch, such as the sweep's controller, runs no torch threads: null)."""
    torch = sys.modules.get("torch")
    if threads is None and torch is not None:
        threads = torch.get_num_threads()
    out = {"hostname": socket.gethostname(), "platform": platform.platform(),
           "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "torch": _version("torch"), "torchvision": _version("torchvision"),
           "numpy": np.__version__, "git_commit": _git_commit(), "source_digest": source_digest(),
           "device": device, **cuda_versions(device), "torch_threads": threads, "pid": os.getpid(),
           "allocator": allocator.settings()}
    out.update(extra)
    return out


