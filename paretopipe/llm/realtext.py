"""Real English prose for a trained language model's perplexity, from an installed package.

gensim's wheel ships the Lee background corpus (``gensim/test/test_data/lee_background.cor``): 300
Australian Broadcasting Corporation news articles, about 60,000 words of plain English, collected
for Lee, Pincombe and Welsh's study of document similarity (2005) and distributed with gensim under
the LGPL-2.1. It is read where pip put it; nothing of it is copied into this project. A trained
model given no ``--eval-text`` is evaluated on it: the portable weights' seeded ids say nothing of
quality, but a real model's perplexity on real text does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "gensim"
RELATIVE = Path("test/test_data/lee_background.cor")
ABOUT = ("the Lee background corpus (300 ABC news articles) from gensim's wheel, "
         "gensim/test/test_data/lee_background.cor (LGPL-2.1)")


def real_text() -> Path | None:
    """The corpus file, or None when gensim is not installed (found, never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / RELATIVE
        if path.is_file():
            return path
    return None
