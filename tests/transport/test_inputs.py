"""Inputs: real photographs by default for codecs, ImageFolder and CIFAR-10 from local folders,
synthetic noise; the manifest says which were used."""

from __future__ import annotations

import json
import re

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


MODEL_WITH_TRANSFORM = '''
import torch
from torch import nn
from torchvision import transforms

INPUT_SIZE = 40


def build(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def transform(image):
    """Squeezed to 40 x 40 (no crop), a grey image in three channels, scaled to [-1, 1]: not what
    the default transform (resize, centre-crop, ImageNet's normalisation) makes."""
    return transforms.Compose([transforms.Grayscale(3), transforms.Resize((40, 40)), transforms.ToTensor(),
                               transforms.Normalize([0.5] * 3, [0.5] * 3)])(image)


def bad(num_classes=10):
    return build(num_classes)
'''


@pytest.mark.slow
def test_a_model_files_transform_prepares_its_folders_images_and_the_split_equals_the_unsplit_model(tmp_path):
    """A user model file's transform() (here grey, squeezed to 40 x 40) is what its folder's
    images go through: stage 1's inputs, and so the split's outputs, equal the unsplit model on
    transform(image), image by image in the folder's order."""
    from PIL import Image

    folder = tmp_path / "images"
    _image_folder(folder)
    (tmp_path / "grey.py").write_text(MODEL_WITH_TRANSFORM)
    spec = f"{tmp_path}/grey.py:build"
    b = cli.builder(spec)
    count = len(list(folder.glob("*/*")))
    s1, _ = cli.run_in_threads(spec, 2, tmp_path, batch_size=1, num_batches=count, warmup=0,
                               dataset=f"imagefolder:{folder}")
    from paretopipe.partition.names import input_transform
    from torchvision.datasets import ImageFolder

    files = [path for path, _ in ImageFolder(str(folder)).samples]
    with torch.no_grad():
        want = [b.model(input_transform(spec)(Image.open(f).convert("RGB")).unsqueeze(0)) for f in files]
    assert len(s1.outputs) == count
    for got, expected in zip(s1.outputs, want):
        assert torch.allclose(got, expected, atol=1e-5)
    # ...and not what the default transform would have made of the same image.
    default = inputs._transform(40, inputs.IMAGENET_MEAN, inputs.IMAGENET_STD)
    with torch.no_grad():
        other = b.model(default(Image.open(files[0]).convert("RGB")).unsqueeze(0))
    assert not torch.allclose(s1.outputs[0], other, atol=1e-3)


def test_a_transform_that_gives_the_wrong_shape_is_one_line(tmp_path):
    folder = tmp_path / "images"
    _image_folder(folder)
    (tmp_path / "wrong.py").write_text(MODEL_WITH_TRANSFORM.replace("Resize((40, 40))", "Resize((32, 32))"))
    # Caught once, when the model file is loaded (before any run), not in every run's first batch.
    with pytest.raises(UsageError, match=r"transform gives 32 x 32 images but the model's input size is 40 x 40: "
                                         r"set INPUT_SIZE = 32"):
        next(inputs.batches(f"imagefolder:{folder}", 1, 40, 1, model=f"{tmp_path}/wrong.py:build"))


def test_a_transform_factory_is_called_once_for_the_transform_it_makes(tmp_path):
    """torchvision's ``weights.transforms()`` is a factory: a model file that names it as its
    transform gets the transform it makes, checked, instead of a TypeError in every run."""
    from PIL import Image

    from paretopipe.partition.names import canonical_name, input_transform

    factory = MODEL_WITH_TRANSFORM.replace("def transform(image):", "def transform():").replace(
        "transforms.Normalize([0.5] * 3, [0.5] * 3)])(image)", "transforms.Normalize([0.5] * 3, [0.5] * 3)])")
    (tmp_path / "factory.py").write_text(factory)
    spec = f"{tmp_path}/factory.py:build"
    canonical_name(spec)
    out = input_transform(spec)(Image.new("RGB", (64, 48), (10, 200, 30)))
    assert tuple(out.shape) == (3, 40, 40) and out.dtype == torch.float32
    assert torch.allclose(out[0], out[1]) and out.min() >= -1 and out.max() <= 1  # grey, in [-1, 1]


@pytest.mark.parametrize("body, what", [
    ("transform = 5", "transform is a int; define transform(image)"),
    ("def transform():\n    return 'resize'", "transform() takes no image and returned a str"),
    ("def transform(image):\n    return [image]", "transform gave list; define transform(image)"),
    ("def transform(image):\n    raise ValueError('no')", "transform failed on a 256 x 256 RGB image: ValueError: no"),
])
def test_a_transform_that_is_not_one_is_refused_in_one_line_when_the_file_loads(tmp_path, body, what):
    from paretopipe.partition.names import canonical_name

    (tmp_path / "odd.py").write_text(MODEL_WITH_TRANSFORM.split("def transform(image):")[0] + body + "\n")
    with pytest.raises(UsageError, match=re.escape(what)):
        canonical_name(f"{tmp_path}/odd.py:build")


def test_a_model_file_without_input_size_whose_transform_gives_another_size_is_refused(tmp_path):
    from paretopipe.partition.names import canonical_name

    (tmp_path / "nosize.py").write_text(MODEL_WITH_TRANSFORM.replace("INPUT_SIZE = 40\n", ""))
    with pytest.raises(UsageError, match=r"gives 40 x 40 images but the model's input size is 224 x 224: set "
                                         r"INPUT_SIZE = 40 in the file \(224 when unset\)"):
        canonical_name(f"{tmp_path}/nosize.py:build")
