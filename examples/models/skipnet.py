"""A user model for ``--model examples/models/skipnet.py:build``: a small CNN with a residual skip
connection and a ``torch.cat`` of two branches, so its cuts must carry more than one tensor.

Any file works the same way: a function that takes the number of classes and returns an
``nn.Module``. ``INPUT_SIZE`` (or an ``input_size`` attribute on the function) sets the square
input side; 224 when absent. On hosts the same path must exist under REMOTE_DIR (``--deploy``
ships the working tree).
"""

import torch
from torch import nn

INPUT_SIZE = 64


class SkipNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.left = nn.Conv2d(16, 8, 1)
        self.right = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.body(x))  # the skip connection spans the body's cuts
        x = torch.cat([self.left(x), self.right(x)], dim=1)
        return self.head(x)


def build(num_classes: int = 10) -> nn.Module:
    return SkipNet(num_classes)
