"""A model's structure (its split tables and block count), and torchvision's list of builders,
cached on disk so that ``split --list``, ``--dry-run`` and a sweep's controller answer without
importing torch.

Importing torch and torchvision alone costs about 3 s on a 2-core VM, more than everything else
``--list`` does. The structure depends only on the model, its number of classes and the torch and
torchvision versions (their graphs decide the cuts), and on this package's version; those form the
key, read from package metadata without importing anything heavy.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from typing import Any, Iterable

from .. import __version__
from ..errors import UsageError
from .names import normalize


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _folder():
    from .weightcache import cache_dir

    root = cache_dir()
    return None if root is None else root / "structure"


def _path(name: str, num_classes: int):
    folder = _folder()
    if folder is None:
        return None
    # "cuts" names the cut rule: 2 is live sets of any width (1 was one live tensor only).
    key = {"model": normalize(name), "num_classes": num_classes, "torch": _version("torch"),
           "torchvision": _version("torchvision"), "paretopipe": __version__, "cuts": 2}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"{normalize(name)}-c{num_classes}-{digest}.json"


def _store(path, doc: Any) -> None:
    from .. import records

    try:
        records.atomic_write_json(path, doc)
    except OSError:
        pass  # a read-only cache only costs the next call its time


def torchvision_builders() -> list[str]:
    """torchvision's classification builder names. Listing them imports torchvision (about 4 s of
    CPU with torch), so the list is kept in the cache per torchvision version."""
    folder = _folder()
    path = folder / f"torchvision-{_version('torchvision')}-models.json" if folder else None
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
        _store(path, names)
    return names


def check_splits(ks: Iterable[Any], num_blocks: int, model: str | None = None, what: str = "split index") -> None:
    """The one range rule for block splits: k in 0..K, where 0 puts the whole model on stage 2 and K
    all of it on stage 1. Raises with the first bad one, in one line that names what is valid."""
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= num_blocks]
    if bad:
        where = f" for {model}" if model else ""
        raise UsageError(f"{what} {bad[0]} out of range{where}: valid 0..{num_blocks} (0 = all on stage 2, "
                         f"{num_blocks} = all on stage 1, 1..{num_blocks - 1} = block cuts)")


def structure(name: str, num_classes: int = 10) -> dict[str, Any]:
    """``{"model", "num_blocks", "block_table", "fine_table", "fine_cuts"}`` for a zoo model, from the cache or
    computed on the meta device (no weights) and stored. Files and registered models are computed
    every time: their code may change under the same name."""
    cacheable = "/" not in name and ":" not in name and not name.endswith(".py")
    path = _path(name, num_classes) if cacheable else None
    if path is not None and path.is_file():
        try:
            doc = json.loads(path.read_text())
            if {"model", "num_blocks", "block_table", "fine_table", "fine_cuts"} <= set(doc):
                return doc
        except (OSError, ValueError):
            pass
    from .names import canonical_name

    canonical_name(name)  # an unknown name is refused here, before torch is imported to trace it
    from .split import fine_cut_table, format_table, partitioner_for

    _, part = partitioner_for(name, batch=1, num_classes=num_classes, structure_only=True)
    doc = {"model": part.model_name, "num_blocks": part.num_blocks, "block_table": format_table(part),
           "fine_table": format_table(part, fine=True), "fine_cuts": fine_cut_table(part)}
    if path is not None and part.model_name is not None:
        _store(path, doc)
    return doc

