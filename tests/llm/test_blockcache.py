"""A named language model's default weights come from the block cache once drawn: the same bits
as drawing them, never drawn twice, a torn or altered entry drawn again, no files with the cache off."""

from __future__ import annotations

import pytest

from paretopipe.llm import build
from paretopipe.partition import weightcache

MODEL = "tiny-lm"


def _fingerprints(splits: list[int]) -> list[str]:
    src = build.source(MODEL)
    return [build.build_stage(src, splits, i).fingerprint() for i in range(len(splits) + 1)]


def test_a_cached_block_is_the_drawn_block_and_is_not_drawn_again(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")
    drawn = _fingerprints([2])
    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    assert _fingerprints([2]) == drawn  # drawn, stored
    entries = sorted(p.name for p in (tmp_path / "lm-blocks").glob("*.safetensors"))
    # the embedding, 4 layers, the norm, and stage 2's head (the tied embedding's values, drawn there)
    assert len(entries) == 7 and any("model_layers_0" in e for e in entries)

    def no_more_draws(*args, **kwargs):
        raise AssertionError("a cached block was drawn again")

    monkeypatch.setattr(build, "portable_values", no_more_draws)
    assert _fingerprints([2]) == drawn  # every block from the cache
    assert _fingerprints([1, 3]) == _fingerprints([1, 3])  # another plan: the same blocks, none drawn


def test_an_altered_entry_is_drawn_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    want = _fingerprints([])
    (entry,) = [p for p in (tmp_path / "lm-blocks").glob("*.safetensors") if "layers_1" in p.name]
    data = bytearray(entry.read_bytes())
    data[-8:] = bytes(8)  # the last values of its last tensor, zeroed: the file still parses
    entry.write_bytes(bytes(data))
    assert _fingerprints([]) == want
    assert "is not the block it names; drawing it again" in caplog.text
    torn = [p for p in (tmp_path / "lm-blocks").glob("*.safetensors") if p.name.startswith("tiny-lm-model_norm")][0]
    torn.write_bytes(torn.read_bytes()[:20])
    assert _fingerprints([]) == want and "is unusable" in caplog.text


def test_with_the_cache_off_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")
    monkeypatch.setenv("HOME", str(tmp_path))
    _fingerprints([1])
    assert not list(tmp_path.rglob("*.safetensors"))


@pytest.mark.parametrize("prefix", ["model.layers.0", "model.norm"])
def test_the_golden_blocks_come_through_the_cache_unchanged(tmp_path, monkeypatch, prefix):
    """What aarch64 computes without transformers (expected_block_weights) equals a block that went
    through the cache and back."""
    from paretopipe.llm.shapes import named
    from paretopipe.partition.models import fingerprint_tensors

    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    src = build.source(MODEL)
    build.block_weights(src, prefix)  # stored
    assert fingerprint_tensors(build.block_weights(src, prefix)) == \
        fingerprint_tensors(build.expected_block_weights(named(MODEL), prefix))
