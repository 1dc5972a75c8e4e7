"""The model zoo's registry (partition.models): a registered model is built by any spelling of its
name and splits exactly, weights load from a file and a mismatch says why, and an unknown name
lists the known ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from paretopipe.errors import UsageError
from paretopipe.partition import fxcuts, models

TOL = 1e-5


def test_register_custom_model_and_split_it():
    @models.register("tiny-test-net", input_size=16)
    def _tiny(num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, num_classes))

    model = models.build("TinyTestNet", num_classes=4)
    x = torch.randn(3, 3, 16, 16)
    part = fxcuts.Partitioner(model, x, models.canonical_name("tiny-test-net"))
    assert len(part.cuts) == 5  # between each of the six layers
    for cut in part.cuts:
        assert fxcuts.verify(model, part.stages([cut.name]), x) <= TOL


def test_weights_load_from_file_and_mismatch_is_clear(tmp_path):
    model = models.build("alexnet")
    torch.save(model.state_dict(), tmp_path / "alexnet.pth")
    loaded = models.build("alexnet", models_dir=tmp_path)
    assert models.fingerprint(loaded) == models.fingerprint(model)
    with pytest.raises(UsageError, match=r"do not fit the model.*shape mismatches.*num-classes"):
        models.build("alexnet", num_classes=7, weights=tmp_path / "alexnet.pth")


def test_unknown_model_lists_known_names():
    with pytest.raises(UsageError, match=r"unknown model 'resnet9000'; known: mobilenetv2, resnet18"):
        models.build("resnet9000")
