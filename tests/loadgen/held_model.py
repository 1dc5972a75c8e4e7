"""A model whose blocks take a scripted time each (a sleep, not this machine's compute), for tests
that assert a pipeline's mechanism rather than this machine's speed: each block holds its input
for HOLD_S and passes it on; the head is a tiny linear layer. A user model file as any other
(``--model tests/loadgen/held_model.py:build``)."""

from __future__ import annotations

import time

import torch
from torch import nn

INPUT_SIZE = 32
HOLD_S = 0.002


def hold(x: torch.Tensor, seconds: float) -> torch.Tensor:
    time.sleep(seconds)
    return x + 0  # a new tensor: the stage's output is its own


torch.fx.wrap("hold")  # a leaf of the traced graph, so the sleep runs in the stage that holds it


class Held(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hold(x, self.seconds)


class HeldNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(*[Held(HOLD_S) for _ in range(4)])
        self.head = nn.Linear(3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def build(num_classes: int = 10) -> nn.Module:
    return HeldNet(num_classes)
