"""Inputs: real photographs by default for codecs, ImageFolder and CIFAR-10 from local folders,
synthetic noise; the manifest says which were used."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import PYTHON
import tcp_helpers as cli
from paretopipe.errors import UsageError
from paretopipe.transport import inputs, wire


def _image_folder(root, per_class: int = 3) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            # Smooth gradients plus a little noise, at odd sizes: the loader must resize and crop.
            h, w = 40 + 7 * i, 52 + 5 * i
            yy, xx = np.mgrid[0:h, 0:w]
            img = np.stack([(xx * 255 // w), (yy * 255 // h), np.full((h, w), 40 * i)], axis=-1)
            img = np.clip(img + rng.integers(0, 8, img.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / cls / f"{i}.png")


def test_photos_are_real_deterministic_and_normalised():
    a = list(inputs.batches("photos", 3, 64, 4))
    b = list(inputs.batches("photos", 3, 64, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # every machine sends the same images
    assert a[0].shape == (3, 3, 64, 64)
    assert not torch.equal(a[0], a[1])  # batches rotate through the set
    flat = torch.cat(a)
    assert -3 < float(flat.mean()) < 3 and 0.3 < float(flat.std()) < 3  # ImageNet-normalised
    info = inputs.describe("photos")
    assert info["dataset"] == "photos" and len(info["images"]) >= 4 and len(info["sha256"]) == 16


def test_photos_compress_like_images_and_noise_does_not():
    """Why photos are the default for codec measurements: zstd on noise measures nothing real."""
    codec = wire.Codec(compression="zstd", wire_dtype="float16")
    photo = next(inputs.batches("photos", 4, 224, 1))
    noise = next(inputs.batches("synthetic", 4, 224, 1))

    def ratio(t: torch.Tensor) -> float:
        p = wire.encode_payload(t, codec)
        return len(bytes(p.data)) / (t.numel() * 2)

    assert ratio(photo) < 0.85 * ratio(noise), (ratio(photo), ratio(noise))
    assert inputs.resolve_default("auto", "zstd") == "photos"
    assert inputs.resolve_default("auto", "none") == "synthetic"


@pytest.mark.slow
def test_image_folder_batches_and_sweep_record_it(tmp_path):
    folder = tmp_path / "images"
    _image_folder(folder)
    got = list(inputs.batches(f"imagefolder:{folder}", 2, 48, 5))
    assert len(got) == 5 and all(x.shape == (2, 3, 48, 48) for x in got)
    assert not torch.equal(got[0], got[1])
    proc = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--model", "resnet18", "--splits", "4", "--runs", "1",
                    "--batch-size", "2", "--num-batches", "2", "--warmup", "0", "--dataset",
                    f"imagefolder:{folder}", "--drift-every", "0", "--local", "--quiet", "--no-report", "--out", str(tmp_path / "out"),
                    "--session", "s"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-1500:]
    record = json.loads(next((tmp_path / "out" / "s" / "runs").glob("*.json")).read_text())
    assert record["config"]["dataset"] == f"imagefolder:{folder}"
    assert record["manifest"]["inputs"] == {"dataset": "imagefolder", "path": str(folder.resolve())}


@pytest.mark.parametrize("spec, message", [
    ("imagefolder:/nonexistent/images", "no such folder"),
    ("imagefolder:", "give the folder"),
    ("cifar10:/nonexistent", "CIFAR-10 not found under /nonexistent"),
    ("imagenet", "unknown dataset 'imagenet'; valid: synthetic, photos, cifar10"),
    ("photos:/x", "photos takes no path"),
])
def test_bad_datasets_are_named(spec, message):
    with pytest.raises(UsageError, match=message):
        inputs.check_local(spec)
    proc = cli.run([PYTHON, "-m", "paretopipe", "sweep", "--dataset", spec, "--dry-run"], timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_empty_image_folder_is_one_line(tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(UsageError, match="imagefolder:"):
        inputs.check_local(f"imagefolder:{tmp_path / 'empty'}")
