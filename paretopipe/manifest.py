"""What a node is: host, CPU, versions, the code's commit and digest, device (with CUDA and driver versions), threads."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


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
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".toml", ".json") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cuda_versions(device: str) -> dict[str, Any]:
    """CUDA runtime and driver versions and the device's name, where a GPU is in use."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
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


def node_manifest(device: str = "cpu", threads: int | None = None, **extra: Any) -> dict[str, Any]:
    """What this node is: host, CPU, versions, git commit, device, threads."""
    import torch

    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:
        tv = None
    out = {"hostname": socket.gethostname(), "platform": platform.platform(),
           "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "torch": torch.__version__, "torchvision": tv,
           "numpy": np.__version__, "git_commit": _git_commit(), "source_digest": source_digest(),
           "device": device, **cuda_versions(device),
           "torch_threads": threads if threads is not None else torch.get_num_threads(),
           "pid": os.getpid()}
    out.update(extra)
    return out


