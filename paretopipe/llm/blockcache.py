"""A disk cache of a named language model's default weights, one file per block, verified on load.

The default weights are drawn from the portable generator (:func:`paretopipe.llm.build.portable_values`):
the same bits on every CPU, but about 2 s of one core per 135 million values. A sweep's warm
workers build their stage's blocks again for every plan, so a sweep of SmolLM2-135M's shape drew
its 135 million values once per configuration, and a sweep of a 1B shape would draw billions. A
block's drawn values are stored here (``lm-blocks/`` beside the image models' ``weights/``) as
safetensors, with their fingerprint beside them; a load that does not reproduce the fingerprint
draws the block again. The key is the source's identity (its configuration and the generator's
version), so a changed shape or generator never reads an old file. Entries are written under a
per-entry lock to a temporary name and renamed, as the weight cache's are. Trained weights (a
folder, a GGUF) are read from their own files and never come here.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Callable

import torch

from ..partition import weightcache
from ..partition.models import fingerprint_tensors

log = logging.getLogger("paretopipe.weights")

Draw = Callable[[str, tuple[int, ...]], torch.Tensor]


def _entry(model: str, identity: str, prefix: str, shapes: dict[str, tuple[int, ...]]) -> Path | None:
    root = weightcache.cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps([identity, prefix, sorted(shapes.items())]).encode()).hexdigest()[:16]
    return root / "lm-blocks" / weightcache.entry_stem(f"{model}-{prefix}", digest, 80)


def _load(entry: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor] | None:
    """The entry's tensors when they are whole: the names and shapes asked for, and their fingerprint."""
    data, meta = entry.with_suffix(".safetensors"), entry.with_suffix(".json")
    if not (data.is_file() and meta.is_file()):
        return None
    try:
        from safetensors.torch import load_file  # lazy for start-up: safetensors

        values = load_file(str(data))
        want = json.loads(meta.read_text())["fingerprint"]
    except Exception as exc:  # a torn or foreign file: draw the block again
        log.warning("language-model block cache entry %s is unusable (%s); drawing it again", data, exc)
        return None
    if {n: tuple(t.shape) for n, t in values.items()} != shapes or fingerprint_tensors(values) != want:
        log.warning("language-model block cache entry %s is not the block it names; drawing it again", data)
        return None
    return values


def block_values(model: str, identity: str, prefix: str, shapes: dict[str, tuple[int, ...]],
                 draw: Draw) -> dict[str, torch.Tensor]:
    """The block ``prefix``'s tensors by name: from the cache, else ``draw(name, shape)`` for each
    and stored. Without a cache folder (``PARETOPIPE_CACHE_DIR=none``, or none writable), drawn."""
    entry = _entry(model, identity, prefix, shapes)
    if entry is None:
        return {name: draw(name, shape) for name, shape in shapes.items()}
    cached = _load(entry, shapes)
    if cached is not None:
        return cached
    from filelock import FileLock, Timeout  # lazy for start-up: filelock
    from safetensors.torch import save_file

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(entry.with_suffix(".lock")), timeout=weightcache.LOCK_TIMEOUT_S):
            cached = _load(entry, shapes)  # another process drew it while we waited
            if cached is not None:
                return cached
            values = {name: draw(name, shape).contiguous() for name, shape in shapes.items()}
            weightcache.atomic_save(values, entry.with_suffix(".safetensors"), lambda obj, p: save_file(obj, str(p)))
            weightcache.atomic_save({"model": model, "block": prefix, "fingerprint": fingerprint_tensors(values)},
                                    entry.with_suffix(".json"), lambda obj, p: p.write_text(json.dumps(obj, indent=1)))
            return values
    except (Timeout, OSError) as exc:
        log.warning("language-model block cache %s could not be used (%s); drawing without it", entry, exc)
        return {name: draw(name, shape) for name, shape in shapes.items()}
