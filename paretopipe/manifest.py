"""What a node is: host, CPU, versions, git commit, device (with CUDA and driver versions), threads."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


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
    gpu = None
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    out = {"hostname": socket.gethostname(), "platform": platform.platform(),
           "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "torch": torch.__version__, "torchvision": tv,
           "numpy": np.__version__, "git_commit": _git_commit(), "device": device, "gpu_name": gpu,
           "torch_threads": threads if threads is not None else torch.get_num_threads(),
           "pid": os.getpid()}
    out.update(extra)
    return out


