"""Which files are the package's code: what its source digest hashes (``manifest.source_digest``)
and what names a host's zygote daemon (``controller.zygote_daemon``). One definition, so that a
change one of them sees the other sees too. Standard library only: a remote stage's start reads it."""

from __future__ import annotations

from pathlib import Path

SOURCE_SUFFIXES = (".py", ".toml", ".json")


def source_files(root: Path) -> list[Path]:
    """The package's source files under ``root``, sorted (bytecode caches left out)."""
    return [path for path in sorted(root.rglob("*"))
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts]
