"""A user's own model, from a file (``--model path/file.py:build``) or a package entry point
(group ``paretopipe.models``), in every command: exact splits, a local sweep, one-line errors."""

from __future__ import annotations

import pytest

import subprocess

import pandas as pd
import torch

from conftest import PYTHON, ROOT
import tcp_helpers as cli
from paretopipe.partition import fxcuts, models

SKIPNET = "examples/models/skipnet.py:build"
TOL = 1e-5


def test_model_file_with_skip_and_cat_splits_exactly_at_every_cut():
    model = models.build(str(ROOT / SKIPNET), num_classes=5)
    assert models.input_size(str(ROOT / SKIPNET)) == 64  # the file's INPUT_SIZE
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    part = fxcuts.Partitioner(model, x, models.canonical_name(str(ROOT / SKIPNET)))
    assert any("cat" in c.name for c in part.cuts) or len(part.cuts) > 8
    for cut in part.cuts:  # fine cuts: inside the skip connection two tensors cross
        assert fxcuts.verify(model, part.stages([cut.name]), x) <= TOL, cut.name
    # Deterministic weights, the same in another process (the weight cache keys on the source digest).
    code = (f"from paretopipe.partition import models; "
            f"print(models.fingerprint(models.build({str(ROOT / SKIPNET)!r}, num_classes=5)))")
    other = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert other == models.fingerprint(model)
    assert models.source_digest(str(ROOT / SKIPNET))


@pytest.mark.slow
def test_model_file_sweeps_locally(tmp_path):
    proc = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--model", SKIPNET, "--splits", "all", "--runs", "1",
                    "--batch-size", "2", "--num-batches", "2", "--warmup", "0", "--num-classes", "7",
                    "--drift-every", "0", "--local", "--quiet", "--out", str(tmp_path), "--session", "s"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "s" / "runs.csv")
    num_blocks = len(runs) - 1
    assert num_blocks >= 3 and set(runs["status"]) == {"complete"}
    assert sorted(runs["split_index"]) == list(range(num_blocks + 1))
    assert set(runs["model"]) == {SKIPNET}


@pytest.mark.slow
def test_user_model_errors_are_one_line(tmp_path):
    (tmp_path / "branchy.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class B(nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.c = nn.Conv2d(3, 4, 3)\n"
        "    def forward(self, x):\n        x = self.c(x)\n        if x.sum() > 0:\n            x = -x\n"
        "        return x.mean((2, 3))\n"
        "def build(n=10):\n    return B()\n"
        "def not_a_model(n=10):\n    return 3\n")
    cases = [
        (f"{tmp_path}/branchy.py:build", "cannot trace B at", "if x.sum() > 0:"),
        (f"{tmp_path}/missing.py:build", "model file", "not found"),
        (f"{tmp_path}/branchy.py:nope", "has no function 'nope'", "build"),
        (f"{tmp_path}/branchy.py:not_a_model", "returned int, not a torch.nn.Module", ""),
    ]
    for spec, first, second in cases:
        proc = subprocess.run([PYTHON, "-m", "paretopipe", "split", "--model", spec, "--list"], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (spec, proc.stderr)
        assert first in lines[0] and second in lines[0], (spec, lines[0])


@pytest.mark.slow
def test_entry_point_model_in_every_process(tmp_path):
    """A package that declares ``[project.entry-points."paretopipe.models"]``: its model is known
    by name to split, to the sweep and to the stage workers it starts."""
    site = tmp_path / "site"
    (site / "tinyzoo").mkdir(parents=True)
    (site / "tinyzoo" / "__init__.py").write_text(
        "from torch import nn\n"
        "def tiny(num_classes=10):\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(),\n"
        "                         nn.Conv2d(8, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(8, num_classes))\n"
        "tiny.input_size = 32\n")
    dist = site / "tinyzoo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyzoo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[paretopipe.models]\ntinynet = tinyzoo:tiny\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    listed = subprocess.run([PYTHON, "-m", "paretopipe", "split", "--model", "tinynet", "--list"], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split()[:3] == ["k", "block", "cut"]
    swept = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--model", "tinynet", "--splits", "all", "--runs", "1",
                     "--batch-size", "2", "--num-batches", "2", "--warmup", "0", "--local", "--quiet",
                     "--drift-every", "0", "--no-report", "--out", str(tmp_path / "out"), "--session", "s"], env=env, timeout=600)
    assert swept.returncode == 0, swept.stderr[-2000:]
    runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv")
    assert set(runs["status"]) == {"complete"} and set(runs["model"]) == {"tinynet"}
