"""A disk cache of the deterministic default weights: built once per machine, verified on every load.

Calibrating BatchNorm in float64 costs seconds per model (MobileNetV2: about 11 s on a 2-core VM)
and every stage worker, RPC rank, profiler and test used to pay it again. An entry is keyed by the
model, its number of classes, its seed, the torch version and :data:`INIT_VERSION` (bump it when
the initialisation in :mod:`paretopipe.partition.models` changes). Each entry stores the weights'
fingerprint beside them; a load that does not reproduce it is rebuilt. Entries are written to a
temporary file and renamed, under a per-entry file lock, so concurrent builders (the two stage
workers of a sweep start together) build once and never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger("paretopipe.weights")

#: Version of the deterministic initialisation; part of every cache key. 2: portable draws
#: (PCG64) for every random parameter and calibration batch, the same bits on x86 and aarch64.
INIT_VERSION = 2
CACHE_ENV = "PARETOPIPE_CACHE_DIR"
#: Builders wait this long for another process building the same entry.
LOCK_TIMEOUT_S = 1800


def cache_dir() -> Path | None:
    """``$PARETOPIPE_CACHE_DIR`` (``none`` turns the cache off), else the user cache folder; weights
    live in its ``weights/`` and model structures in its ``structure/``."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "none", "off", "0") else Path(value).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("paretopipe"))


_SCRATCH: dict[str, Any] = {}


def process_scratch(kind: str) -> Path:
    """Where files that would be cached go when the cache is turned off: one folder per process and
    ``kind`` (``engines``, ``gguf``), removed at the process's exit."""
    import tempfile

    if kind not in _SCRATCH:
        _SCRATCH[kind] = tempfile.TemporaryDirectory(prefix=f"paretopipe-{kind}-")
    return Path(_SCRATCH[kind].name)


def cache_key(canonical: str, num_classes: int, seed: int, source_digest: str | None = None) -> dict[str, Any]:
    import torch

    key = {"model": canonical, "num_classes": num_classes, "seed": seed, "torch": torch.__version__,
           "init_version": INIT_VERSION}
    if source_digest is not None:
        key["source"] = source_digest
    return key


def entry_stem(label: str, tail: str, limit: int = 60) -> str:
    """A cache file's name before its suffix: the last ``limit`` characters of ``label`` with
    anything but letters, digits, ``_`` and ``-`` made ``_``, then ``tail`` (the key's digest). No
    dots: the suffix names the file's kind (``.pt``, ``.json``, ``.lock``), and ``with_suffix`` on a
    dotted stem (a model file's ``mymodel.py:build``) cut the digest off, so such entries shared files."""
    safe = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)[-limit:]
    return f"{safe}-{tail}"


def _entry(root: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / entry_stem(key["model"], f"c{key['num_classes']}-{digest}")


def atomic_save(obj: Any, path: Path, writer: Callable[[Any, Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer(obj, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _load(model: nn.Module, entry: Path, fingerprint: Callable[[nn.Module], str]) -> bool:
    """Load the entry into ``model``; True only when the weights reproduce their fingerprint."""
    import torch

    weights, meta = entry.with_suffix(".pt"), entry.with_suffix(".json")
    if not (weights.is_file() and meta.is_file()):
        return False
    try:
        want = json.loads(meta.read_text())["fingerprint"]
        state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
        model.load_state_dict(state, strict=True, assign=True)
    except Exception as exc:  # a torn, foreign or stale file: rebuild it
        log.warning("weight cache entry %s is unusable (%s); rebuilding it", weights, exc)
        return False
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        return False
    got = fingerprint(model)
    if got != want:
        log.warning("weight cache entry %s has fingerprint %s, not %s; rebuilding it", weights, got, want)
        return False
    return True


def cached_build(key: dict[str, Any], skeleton: Callable[[], nn.Module], build: Callable[[], nn.Module],
                 fingerprint: Callable[[nn.Module], str]) -> tuple[nn.Module, str]:
    """The model of ``key``: loaded into ``skeleton()`` from the cache, else ``build()`` and stored.

    Returns (model, how) with ``how`` one of ``cache``, ``built`` or ``uncached``.
    """
    root = cache_dir()
    if root is None:
        return build(), "uncached"
    root = root / "weights"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("weight cache %s is not writable (%s); building without it", root, exc)
        return build(), "uncached"
    entry = _entry(root, key)
    model = skeleton()
    if _load(model, entry, fingerprint):
        return model, "cache"
    import torch
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(entry.with_suffix(".lock")), timeout=LOCK_TIMEOUT_S):
            model = skeleton()
            if _load(model, entry, fingerprint):  # another process built it while we waited
                return model, "cache"
            model = build()
            fp = fingerprint(model)
            atomic_save(model.state_dict(), entry.with_suffix(".pt"), lambda obj, p: torch.save(obj, p))
            atomic_save({**key, "fingerprint": fp}, entry.with_suffix(".json"),
                         lambda obj, p: p.write_text(json.dumps(obj, indent=1)))
            return model, "built"
    except (Timeout, OSError) as exc:
        log.warning("weight cache %s could not be used (%s); building without it", entry, exc)
        return build(), "uncached"
