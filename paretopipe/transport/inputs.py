"""Input batches: seeded synthetic images (default, nothing downloads) or CIFAR-10 from a local folder."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from ..errors import UsageError

DATASETS = ("synthetic", "cifar10")
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def synthetic_batch(index: int, batch_size: int, size: int, seed: int = 0) -> torch.Tensor:
    """Batch ``index`` of the seeded synthetic dataset: identical on every machine."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randn(batch_size, 3, size, size, generator=gen)


def check_dataset(dataset: str) -> str:
    if dataset not in DATASETS and dataset != "dummy":
        raise UsageError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)} (the anchor's dummy is synthetic)")
    return dataset


def batches(dataset: str, batch_size: int, size: int, count: int, data_dir: str | None = None,
            seed: int = 0) -> Iterator[torch.Tensor]:
    """``count`` batches of ``batch_size`` images at ``size`` x ``size``."""
    if dataset in ("synthetic", "dummy"):
        for i in range(count):
            yield synthetic_batch(i, batch_size, size, seed)
        return
    if dataset != "cifar10":
        raise UsageError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    yield from _cifar10(batch_size, size, count, data_dir)


def _cifar10(batch_size: int, size: int, count: int, data_dir: str | None) -> Iterator[torch.Tensor]:
    import torchvision
    from torchvision import transforms

    root = Path(data_dir or "data")
    if not (root / "cifar-10-batches-py").is_dir():
        raise UsageError(f"CIFAR-10 not found under {root} (expects {root}/cifar-10-batches-py; "
                         f"nothing is downloaded here): pass --data-dir or use --dataset synthetic")
    tf = transforms.Compose([transforms.Resize(size), transforms.ToTensor(),
                             transforms.Normalize(CIFAR_MEAN, CIFAR_STD)])
    ds = torchvision.datasets.CIFAR10(root=str(root), train=False, download=False, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, drop_last=True)
    produced = 0
    while produced < count:
        for images, _ in loader:
            yield images
            produced += 1
            if produced >= count:
                return
