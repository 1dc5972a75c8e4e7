"""Input batches. Nothing downloads: every dataset is generated or read from local files.

A dataset is named by a spec:

- ``synthetic`` (the anchor's ``dummy``): seeded Gaussian noise, identical on every machine of
  one architecture (torch's sampler differs in the last bits between x86 and aarch64);
- ``photos``: the colour photographs scikit-image ships inside its wheel (astronaut, coffee,
  chelsea, ...), so compression ratios are measured on real content;
- ``cifar10`` or ``cifar10:PATH``: the CIFAR-10 test set from a local ``cifar-10-batches-py``;
- ``imagefolder:PATH``: torchvision's ImageFolder layout (``PATH/<class>/<image>``).

Real images are resized (shorter side) and centre-cropped to the model's input size, then
normalised with ImageNet's statistics (CIFAR-10 with its own).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ..errors import UsageError
from ..partition.names import input_transform

if TYPE_CHECKING:  # torch is imported where batches are made: naming a dataset must not cost ~2 s of CPU
    import torch

DATASETS = ("synthetic", "photos", "cifar10", "cifar10:PATH", "imagefolder:PATH")
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Colour photographs in scikit-image's own wheel (no pooch download): real content for codecs.
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg",
          "retina.jpg", "ihc.png")


def synthetic_batch(index: int, batch_size: int, size: int, seed: int = 0) -> torch.Tensor:
    """Batch ``index`` of the seeded synthetic dataset: identical on every machine of one
    architecture (x86 and aarch64 differ in the last bits; ``photos`` is bit-identical on both)."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randn(batch_size, 3, size, size, generator=gen)


def parse_dataset(spec: str, data_dir: str | None = None) -> tuple[str, str | None]:
    """``(kind, path)`` of a dataset spec; ``data_dir`` is the anchor's separate CIFAR-10 folder flag."""
    kind, _, path = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "dummy":
        kind = "synthetic"
    if kind in ("synthetic", "photos"):
        if path:
            raise UsageError(f"dataset {spec!r}: {kind} takes no path; valid: {', '.join(DATASETS)}")
        return kind, None
    if kind == "cifar10":
        return kind, path or data_dir or "data"
    if kind == "imagefolder":
        if not path:
            raise UsageError(f"dataset {spec!r}: give the folder, e.g. imagefolder:/data/imagenet-val")
        return kind, path
    raise UsageError(f"unknown dataset {spec!r}; valid: {', '.join(DATASETS)} (the anchor's dummy is synthetic)")


def check_dataset(dataset: str) -> str:
    parse_dataset(dataset)
    return dataset


def resolve_default(dataset: str | None, compression: str) -> str:
    """``auto``/None: real photographs when a codec is measured (noise does not compress like
    images), the synthetic set otherwise."""
    if dataset in (None, "", "auto"):
        return "photos" if compression != "none" else "synthetic"
    return check_dataset(dataset)


def check_local(spec: str, data_dir: str | None = None) -> None:
    """Fail now, in one line, when a dataset that this machine will read is not here."""
    kind, path = parse_dataset(spec, data_dir)
    if kind == "cifar10" and not (Path(path) / "cifar-10-batches-py").is_dir():
        raise UsageError(f"CIFAR-10 not found under {path} (expects {path}/cifar-10-batches-py; nothing is "
                         f"downloaded here): give cifar10:PATH or --data-dir, or use --dataset synthetic")
    if kind == "imagefolder":
        _image_folder(path, 32)


def batches(dataset: str, batch_size: int, size: int, count: int, data_dir: str | None = None,
            seed: int = 0, model: str | None = None) -> Iterator[torch.Tensor]:
    """``count`` batches of ``batch_size`` images at ``size`` x ``size`` (a folder's through
    ``model``'s own transform where its model file defines one)."""
    import torch

    kind, path = parse_dataset(dataset, data_dir)
    if kind == "synthetic":
        for i in range(count):
            yield synthetic_batch(i, batch_size, size, seed)
        return
    images = _photos(size) if kind == "photos" else None
    if images is not None:
        for i in range(count):
            # The same images in a seeded rotation: each batch differs, every machine agrees.
            start = (seed * 7 + i * batch_size) % len(images)
            yield torch.stack([images[(start + j) % len(images)] for j in range(batch_size)])
        return
    ds = _cifar10(path, size) if kind == "cifar10" else _image_folder(path, size, model)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False, drop_last=True)
    if len(loader) == 0:
        raise UsageError(f"dataset {dataset!r} holds {len(ds)} images, fewer than one batch of {batch_size}")
    produced = 0
    while produced < count:
        for images_batch, _ in loader:
            yield images_batch
            produced += 1
            if produced >= count:
                return


class Prefetcher:
    """The anchor's ``--enable-prefetch``: a thread prepares up to ``depth`` batches ahead (decoded,
    transformed, stacked), so the source's loop only takes a ready tensor off a queue.

    Iterating yields the batches in order; an error in the thread is raised at the batch it would
    have produced; :meth:`close` stops the thread early (a run that ends before its last batch)."""

    _DONE = object()

    def __init__(self, source: Iterator[torch.Tensor], depth: int) -> None:
        import queue
        import threading

        if depth < 1:
            raise UsageError(f"--prefetch-batches {depth}: must be at least 1")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._source = source
        self._thread = threading.Thread(target=self._fill, name="prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            for batch in self._source:
                if not self._put(batch):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            self._put(exc)
            return
        self._put(self._DONE)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> torch.Tensor:
        item = self._queue.get()
        if item is self._DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


def source_batches(dataset: str, batch_size: int, size: int, count: int, data_dir: str | None = None,
                   seed: int = 0, prefetch: int = 0, model: str | None = None) -> Iterator[torch.Tensor]:
    """:func:`batches`, prepared ``prefetch`` batches ahead in a thread when ``prefetch`` > 0."""
    it = batches(dataset, batch_size, size, count, data_dir, seed, model)
    return Prefetcher(it, prefetch) if prefetch > 0 else it


class SampleSet:
    """A dataset one image at a time, with its label where it has one: what a LoadGen query
    sample library loads by index. Synthetic and photo inputs have ``count`` samples and no
    labels; CIFAR-10 and an ImageFolder have their own size and labels. An ImageFolder whose class
    folders are all numbers is labelled by those numbers (class indices of the model's head);
    otherwise by the folders' sorted order, as torchvision's ImageFolder (and ImageNet's) does."""

    def __init__(self, dataset: str, size: int, count: int, data_dir: str | None = None, seed: int = 0,
                 model: str | None = None) -> None:
        self.kind, path = parse_dataset(dataset, data_dir)
        self.size, self.seed = size, seed
        self._images = _photos(size) if self.kind == "photos" else None
        self._ds = None
        self._labels: list[int] | None = None
        if self.kind == "cifar10":
            self._ds = _cifar10(path, size)
            self._labels = [int(t) for t in self._ds.targets]
        elif self.kind == "imagefolder":
            self._ds = _image_folder(path, size, model)
            names = self._ds.classes
            numbered = all(n.isdigit() for n in names)
            self._labels = [int(names[t]) if numbered else int(t) for t in self._ds.targets]
        self.count = len(self._ds) if self._ds is not None else count
        if self.count < 1:
            raise UsageError(f"dataset {dataset!r} holds no images")

    @property
    def labelled(self) -> bool:
        return self._labels is not None

    def __len__(self) -> int:
        return self.count

    def image(self, index: int) -> torch.Tensor:
        """Sample ``index`` as one image, channels first (no batch dimension)."""
        if self.kind == "synthetic":
            return synthetic_batch(index, 1, self.size, self.seed)[0]
        if self._images is not None:
            return self._images[(self.seed * 7 + index) % len(self._images)]
        return self._ds[index][0]

    def label(self, index: int) -> int | None:
        return None if self._labels is None else self._labels[index]


def describe(dataset: str, data_dir: str | None = None) -> dict[str, Any]:
    """What the manifest records about the inputs: the kind, where they came from, how many."""
    kind, path = parse_dataset(dataset, data_dir)
    out: dict[str, Any] = {"dataset": kind}
    if kind == "synthetic":
        out["source"] = "seeded Gaussian noise (torch.Generator), identical on every machine of one architecture"
    elif kind == "photos":
        files = _photo_files()
        out.update(source="scikit-image sample photographs", images=[f.name for f in files],
                   sha256=_digest_of(tuple(map(str, files))))
    else:
        out.update(path=str(Path(path).resolve()))
    return out


class _CheckedTransform:
    """A model file's ``transform()``, its result checked: a float tensor of C x size x size (what
    the model's input takes), refused in one line otherwise."""

    def __init__(self, transform: Any, size: int, model: str) -> None:
        self.transform, self.size, self.model = transform, size, model

    def __call__(self, image: Any) -> torch.Tensor:
        import torch

        out = self.transform(image)
        if not (isinstance(out, torch.Tensor) and out.is_floating_point() and out.dim() == 3
                and tuple(out.shape[1:]) == (self.size, self.size)):
            got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise UsageError(f"model {self.model}: transform() gave {got}; give a float tensor of channels x "
                             f"{self.size} x {self.size}")
        return out.float()


def _transform(size: int, mean: Sequence[float], std: Sequence[float]):
    from torchvision import transforms

    return transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor(),
                               transforms.Normalize(mean, std)])


def _photo_files() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("dataset photos needs scikit-image (pip install scikit-image); or use --dataset synthetic")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = [folder / name for name in PHOTOS if (folder / name).is_file()]
    if not files:
        raise UsageError(f"scikit-image's sample photographs are missing from {folder}; use --dataset synthetic")
    return files


@functools.lru_cache(maxsize=None)
def _digest_of(names: tuple[str, ...]) -> str:
    return _digest([Path(n) for n in names])


def _digest(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _photos(size: int) -> list[torch.Tensor]:
    from PIL import Image

    tf = _transform(size, IMAGENET_MEAN, IMAGENET_STD)
    return [tf(Image.open(f).convert("RGB")) for f in _photo_files()]


def _cifar10(root: str, size: int):
    import torchvision

    if not (Path(root) / "cifar-10-batches-py").is_dir():
        check_local(f"cifar10:{root}")
    tf = _transform(size, CIFAR_MEAN, CIFAR_STD)
    return torchvision.datasets.CIFAR10(root=root, train=False, download=False, transform=tf)


def _image_folder(root: str, size: int, model: str | None = None):
    """A folder of class folders, each image resized, centre-cropped and normalised as ImageNet's
    are, or through ``model``'s own ``transform()`` (a user model file's)."""
    from torchvision.datasets import ImageFolder

    if not os.path.isdir(root):
        raise UsageError(f"imagefolder:{root}: no such folder (expects {root}/<class>/<image files>)")
    own = input_transform(model) if model else None
    try:
        return ImageFolder(root, transform=_CheckedTransform(own, size, model) if own is not None
                           else _transform(size, IMAGENET_MEAN, IMAGENET_STD))
    except (FileNotFoundError, RuntimeError) as exc:
        raise UsageError(f"imagefolder:{root}: {' '.join(str(exc).split())[:160]} "
                         f"(expects {root}/<class>/<image files>)")
