"""Model names resolve without torch: the checks every command makes before its stages build anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from paretopipe.errors import UsageError
from paretopipe.partition import names, weightcache

NO_TORCH = "\nassert 'torch' not in sys.modules and 'torchvision' not in sys.modules, 'torch was imported'"


def _without_torch(code: str, cache) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys\n" + code + NO_TORCH], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, weightcache.CACHE_ENV: str(cache)}, timeout=120)


def test_torchvision_names_are_listed_once_per_version_then_read_without_torch(tmp_path, monkeypatch):
    import torchvision.models as tvm

    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    assert names.canonical_name("RegNet-Y-400MF") == "regnet_y_400mf"
    (listing,) = tmp_path.glob("structure/torchvision-*-models.json")
    assert json.loads(listing.read_text()) == tvm.list_models(module=tvm)
    proc = _without_torch("from paretopipe.partition.names import canonical_name, input_size\n"
                          "print(canonical_name('regnet_y_400mf'), canonical_name('MobileNetV2'), "
                          "input_size('inceptionv3'), input_size('resnet18'))", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["regnet_y_400mf", "mobilenet_v2", "299", "224"]


def test_a_damaged_listing_is_listed_again(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    names.known_models()
    (listing,) = tmp_path.glob("structure/torchvision-*-models.json")
    listing.write_text('{"not": "a list"')
    assert names.canonical_name("regnet_y_400mf") == "regnet_y_400mf"
    assert "regnet_y_400mf" in json.loads(listing.read_text())


def test_an_unknown_name_is_refused_naming_the_valid_ones(tmp_path, monkeypatch):
    monkeypatch.setenv(weightcache.CACHE_ENV, str(tmp_path))
    with pytest.raises(UsageError) as err:
        names.canonical_name("resnet-nineteen")
    message = str(err.value)
    assert message.startswith("unknown model 'resnet-nineteen'; known: mobilenetv2, resnet18,")
    assert "regnet_y_400mf" in message and "path/to/file.py:function" in message
    # split --list says so without importing torch (the listing is cached by now).
    proc = _without_torch("from paretopipe.cli.main import main\n"
                          "try:\n    main(['split', '--model', 'nope', '--list'])\n"
                          "except Exception as exc:\n    print(type(exc).__name__, exc)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("UsageError unknown model 'nope'; known: mobilenetv2"), proc.stdout


def test_a_sweep_plan_imports_no_torch(tmp_path):
    """The controller of a sweep only orchestrates; its stages build the model. Once the cache holds
    the names and the structures (the first plan writes them), a plan imports no torch: about 4 s of
    CPU saved per sweep and per --dry-run."""
    plan = ("from paretopipe.cli.main import main\n"
            "try:\n    main(['sweep', '--models', 'mobilenetv2,resnet34', '--splits', '2', '--dry-run'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code")
    first = subprocess.run([sys.executable, "-c", plan], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, weightcache.CACHE_ENV: str(tmp_path)}, timeout=120)
    assert first.returncode == 0, first.stderr
    again = _without_torch(plan, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert again.stdout.startswith("6 runs locally") and "resnet34_tcp_lan_k02_r2" in again.stdout, again.stdout


def test_names_are_case_and_dash_insensitive():
    assert names.canonical_name("MobileNet-V2") == "mobilenet_v2"
    assert names.canonical_name("Wide_ResNet50-2") == "wide_resnet50_2"
    assert names.input_size("InceptionV3") == 299 and names.input_size("resnet18") == 224
