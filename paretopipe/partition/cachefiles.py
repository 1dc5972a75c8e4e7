"""Where the partition layer keeps what it computes once per version: the structure cache's
folder, an atomic store that a read-only cache does not break, and torchvision's list of builders.

A leaf: :mod:`.names` (which asks torchvision's builders) and :mod:`.structure` both use it, and it
imports no torch (torchvision is imported only on a cache miss, for start-up time).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import records
from .weightcache import cache_dir


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def folder() -> Path | None:
    """The structure cache's folder (None where no cache can be kept)."""
    root = cache_dir()
    return None if root is None else root / "structure"


def store(path: Path, doc: Any) -> None:
    try:
        records.atomic_write_json(path, doc)
    except OSError:
        pass  # a read-only cache only costs the next call its time


def torchvision_builders() -> list[str]:
    """torchvision's classification builder names. Listing them imports torchvision (about 4 s of
    CPU with torch), so the list is kept in the cache per torchvision version."""
    root = folder()
    path = root / f"torchvision-{version('torchvision')}-models.json" if root else None
    if path is not None and path.is_file():
        try:
            names = json.loads(path.read_text())
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return names
        except (OSError, ValueError):
            pass
    import torchvision.models as tvm

    names = tvm.list_models(module=tvm)
    if path is not None:
        store(path, names)
    return names
