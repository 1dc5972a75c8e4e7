"""torchvision's weight names (``--weights DEFAULT``, ``IMAGENET1K_V1``, ...) as files in torch's
hub cache: ``$TORCH_HOME/hub/checkpoints/<the file the weights' URL names>``, where torchvision's
own ``weights=`` looks. A file there is loaded as any state dict is (``weights_only``); a missing
one is downloaded as torchvision would, unless offline (``PARETOPIPE_OFFLINE=1`` or
``HF_HUB_OFFLINE=1``), which is refused in one line that names the file and where to put it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

from ..errors import UsageError

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
OFFLINE_ENVS = ("PARETOPIPE_OFFLINE", "HF_HUB_OFFLINE")


def is_weight_name(weights: str | os.PathLike | None) -> bool:
    """``DEFAULT`` or an enum member's name such as ``IMAGENET1K_V1`` (a path has a slash or a dot)."""
    return isinstance(weights, str) and bool(_NAME.match(weights))


def offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no") for v in OFFLINE_ENVS)


def resolve(canonical: str, name: str) -> tuple[Path, int]:
    """The local file of torchvision's ``name`` weights for ``canonical``, and their classes."""
    import torch
    import torchvision.models as tvm

    try:
        enum = tvm.get_model_weights(canonical)
    except (KeyError, ValueError):
        raise UsageError(f"--weights {name}: torchvision has no weight names for {canonical}; give a state-dict .pth")
    valid = ["DEFAULT", *(w.name for w in enum)]
    if name not in valid:
        raise UsageError(f"--weights {name}: not a weight name of {canonical}; valid: {', '.join(valid)}")
    weights = enum.DEFAULT if name == "DEFAULT" else enum[name]
    path = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name
    if not path.is_file():
        _fetch(weights.url, path, f"--weights {name} ({canonical} {weights.name})")
    return path, len(weights.meta["categories"])


def _fetch(url: str, path: Path, what: str) -> None:
    where = f"put {path.name} ({url}) in {path.parent} (TORCH_HOME={os.environ.get('TORCH_HOME', '~/.cache/torch')})"
    if offline():
        raise UsageError(f"{what}: {path} is not in torch's hub cache and this machine is offline "
                         f"({'/'.join(OFFLINE_ENVS)} set); {where}")
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, str(path), progress=False)
    except Exception as exc:  # urllib's and socket's errors vary by cause: each is the same to the user
        raise UsageError(f"{what}: cannot download it ({type(exc).__name__}: {' '.join(str(exc).split())[:100]}); "
                         f"{where}")
