"""The weight cache: built once, loaded bit-identical, rebuilt when damaged, safe under concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
import tcp_helpers
from paretopipe.partition import models, weightcache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_build_then_load_gives_the_same_weights(cache):
    cold = models.build("resnet18", num_classes=4)
    (weights,) = cache.glob("weights/resnet18-c4-*.pt")
    meta = json.loads(weights.with_suffix(".json").read_text())
    assert meta["fingerprint"] == models.fingerprint(cold)
    assert meta["torch"] == torch.__version__ and meta["init_version"] == weightcache.INIT_VERSION
    warm = models.build("resnet18", num_classes=4)
    assert models.fingerprint(warm) == models.fingerprint(cold)
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(warm(x), cold(x))  # the loaded model computes exactly the same
    assert not any(p.requires_grad for p in warm.parameters()) and not warm.training


def test_keys_separate_what_differs():
    a = weightcache.cache_key("resnet18", 10, 1)
    names = {weightcache._entry(weightcache.Path("/c"), k).name for k in (
        a, {**a, "num_classes": 4}, {**a, "seed": 2}, {**a, "torch": "0.0"}, {**a, "init_version": -1})}
    assert len(names) == 5
    # A model file's name has dots: its entries' files still differ by key, digest and all.
    user = weightcache.cache_key("mymodel.py:build", 10, 1, "abc")
    files = {weightcache._entry(weightcache.Path("/c"), k).with_suffix(".pt").name for k in (
        user, {**user, "num_classes": 4}, {**user, "source": "def"})}
    assert len(files) == 3 and all(f.startswith("mymodel_py_build-c") for f in files), files


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["weights", "fingerprint", "truncated"])
def test_a_damaged_entry_is_rebuilt(cache, damage):
    good = models.fingerprint(models.build("resnet18", num_classes=3))
    (weights,) = cache.glob("weights/resnet18-c3-*.pt")
    if damage == "weights":
        state = torch.load(weights, weights_only=True)
        state["fc.bias"] += 1.0
        torch.save(state, weights)
    elif damage == "fingerprint":
        meta = json.loads(weights.with_suffix(".json").read_text())
        weights.with_suffix(".json").write_text(json.dumps({**meta, "fingerprint": "0" * 16}))
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    rebuilt = models.build("resnet18", num_classes=3)
    assert models.fingerprint(rebuilt) == good
    assert json.loads(weights.with_suffix(".json").read_text())["fingerprint"] == good
    assert models.fingerprint(models.build("resnet18", num_classes=3)) == good


@pytest.mark.slow
def test_concurrent_builders_build_once(cache):
    """Four processes ask for the same entry at once: one builds (slowly), the others wait and load."""
    script = textwrap.dedent("""
        import sys, time, torch
        from paretopipe.partition import models, weightcache
        def build():
            time.sleep(1.5)
            torch.manual_seed(0)
            return torch.nn.Linear(64, 8)
        key = weightcache.cache_key("slow-linear", 8, 0)
        model, how = weightcache.cached_build(key, lambda: torch.nn.Linear(64, 8, device="meta"), build,
                                              models.fingerprint)
        print(how, models.fingerprint(model))
    """)
    env = {**os.environ, weightcache.CACHE_ENV: str(cache)}
    # Forked from the test process's zygote where it can be (the cache folder is read at each call).
    path = cache.parent / "build_slowly.py"
    path.write_text(script)
    procs = [tcp_helpers.popen([sys.executable, str(path)], env=env, cwd=ROOT) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    hows = sorted(o.split()[0] for o, _ in outs)
    assert hows == ["built", "cache", "cache", "cache"]
    assert len({o.split()[1] for o, _ in outs}) == 1
    assert not list(cache.glob("weights/.*.tmp"))  # no temporary file left behind


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, "none")
    model, how = weightcache.cached_build(weightcache.cache_key("x", 1, 0), lambda: torch.nn.Linear(1, 1),
                                          lambda: torch.nn.Linear(1, 1), models.fingerprint)
    assert how == "uncached" and not list(tmp_path.iterdir())


def test_split_list_is_answered_from_the_structure_cache(cache):
    from paretopipe.partition.structure import structure

    first = structure("resnet18")
    (entry,) = cache.glob("structure/resnet18-c10-*.json")
    assert first["num_blocks"] == 9 and "layer4.1" in first["block_table"]
    code = ("import sys, io, contextlib; from paretopipe.cli.split import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out: main(['--model', 'ResNet-18', '--list'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'; print(out.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, weightcache.CACHE_ENV: str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == first["block_table"]


def test_structure_only_needs_no_weights():
    from paretopipe.partition import tables

    meta_model, meta_part = tables.partitioner_for("vgg16", structure_only=True)
    assert all(p.is_meta for p in meta_model.parameters())
    _, real = tables.partitioner_for("alexnet")
    _, meta_alex = tables.partitioner_for("alexnet", structure_only=True)
    assert [c.name for c in meta_alex.cuts] == [c.name for c in real.cuts]
    assert [c.nbytes for c in meta_alex.cuts] == [c.nbytes for c in real.cuts]
    assert meta_alex.total_flops == real.total_flops and meta_alex.num_blocks == real.num_blocks
    assert meta_part.num_blocks == 31
