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
from pathlib import Path
from typing import Any

from .. import __version__
from .cachefiles import folder, store, version
from .names import DEFAULT_NUM_CLASSES, canonical_name, normalize


def _path(name: str, num_classes: int) -> Path | None:
    root = folder()
    if root is None:
        return None
    # "cuts" names the cut rule: 2 is live sets of any width (1 was one live tensor only).
    key = {"model": normalize(name), "num_classes": num_classes, "torch": version("torch"),
           "torchvision": version("torchvision"), "paretopipe": __version__, "cuts": 2}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{normalize(name)}-c{num_classes}-{digest}.json"


def structure(name: str, num_classes: int = DEFAULT_NUM_CLASSES) -> dict[str, Any]:
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
    canonical_name(name)  # an unknown name is refused here, before torch is imported to trace it
    # lazy for start-up: torch; a cache hit (above) answers --list and --dry-run without it.
    from .tables import fine_cut_table, format_table, partitioner_for

    _, part = partitioner_for(name, batch=1, num_classes=num_classes, structure_only=True)
    doc = {"model": part.model_name, "num_blocks": part.num_blocks, "block_table": format_table(part),
           "fine_table": format_table(part, fine=True), "fine_cuts": fine_cut_table(part)}
    if path is not None and part.model_name is not None:
        store(path, doc)
    return doc

