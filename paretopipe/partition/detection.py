"""Detectors split exactly: the input transform on the first stage, the backbone and feature
pyramid traced and cut like any model, the heads and post-processing on the last stage.

A detector's heads and post-processing (anchor generation, box decoding, NMS) are not fx-traceable
and need not be: every cut lies in the backbone and the pyramid, where the pyramid's several
outputs cross a cut together as a live set. A :class:`Detector` holds the three parts; its
forward is the unsplit model, and :class:`paretopipe.partition.fxcuts.Partitioner` traces its
``body`` only, putting ``pre`` before the first stage and ``post`` after the last.

The output is a fixed-shape tuple, so that it travels as one frame and batches stack: boxes
``[B, D, 4]`` (x1, y1, x2, y2 in input pixels), scores ``[B, D]``, labels ``[B, D]`` and the
number of detections per image ``[B]``; rows past an image's count are zero (label -1).

Inputs are the pipeline's images, normalised with ImageNet's mean and std (``--dataset photos``,
``imagefolder``) or synthetic noise; ``pre`` maps them back to pixels before the model's own
transform. The score threshold is low (:data:`SCORE_THRESHOLD`), so that the deterministic
weights give detections to compare.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import nn

from ..errors import UsageError
from .activation import live_tensors

SCORE_THRESHOLD = 0.001
MAX_DETECTIONS = 100  # per image: the rows of the output
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)

Detections = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Detector(nn.Module):
    """``post(body(pre(x)))``: ``body`` is traced and split; ``pre`` runs on the first stage and
    ``post`` on the last."""

    def __init__(self, pre: nn.Module, body: nn.Module, post: nn.Module) -> None:
        super().__init__()
        self.pre, self.body, self.post = pre, body, post

    def forward(self, x: torch.Tensor) -> Detections:
        return self.post(*live_tensors(self.body(self.pre(x))))


class FirstStage(nn.Module):
    """A detector's first stage: its transform, then its share of the body."""

    def __init__(self, pre: nn.Module, stage: nn.Module) -> None:
        super().__init__()
        self.pre, self.stage = pre, stage

    def forward(self, x: torch.Tensor) -> Any:
        return self.stage(self.pre(x))


class LastStage(nn.Module):
    """A detector's last stage: its share of the body, then the heads and post-processing."""

    def __init__(self, stage: nn.Module, post: nn.Module) -> None:
        super().__init__()
        self.stage, self.post = stage, post

    def forward(self, *xs: torch.Tensor) -> Detections:
        return self.post(*live_tensors(self.stage(*xs)))


def pack(detections: list[dict[str, torch.Tensor]], limit: int = MAX_DETECTIONS) -> Detections:
    """Per-image detections (``boxes``, ``scores``, ``labels``) as the fixed-shape output tuple."""
    n = len(detections)
    boxes, scores = torch.zeros(n, limit, 4), torch.zeros(n, limit)
    labels, counts = torch.full((n, limit), -1, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
    for i, d in enumerate(detections):
        k = min(limit, int(d["scores"].numel()))
        boxes[i, :k], scores[i, :k], labels[i, :k] = d["boxes"][:k].float(), d["scores"][:k].float(), d["labels"][:k]
        counts[i] = k
    return boxes, scores, labels, counts


class _ToPixels(nn.Module):
    """ImageNet-normalised images back to [0, 1] (``scale`` 255: to pixel values, as YOLOX takes)."""

    def __init__(self, scale: float = 1.0, bgr: bool = False) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)
        self.scale, self.bgr = scale, bgr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x * self.std.to(x.dtype) + self.mean.to(x.dtype)) * self.scale
        return x.flip(1) if self.bgr else x


class _FeatureTuple(nn.Module):
    """A backbone that returns a dict of feature maps, returning them as a tuple (fx traces it)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.backbone(x).values())


class _TorchvisionPre(nn.Module):
    """The detector's own transform (resize, normalise, batch), on pixels in [0, 1]."""

    def __init__(self, transform: nn.Module) -> None:
        super().__init__()
        self.pixels, self.transform = _ToPixels(), transform

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.transform(list(self.pixels(x)))[0].tensors


class _TorchvisionPost(nn.Module):
    """What torchvision's detector does after its backbone, on the features of images that all had
    the pipeline's size (so the transform's sizes are known once, at build)."""

    def __init__(self, model: nn.Module, size: int, names: list[str]) -> None:
        super().__init__()
        self._model = [model]  # its methods and settings; not registered, so its backbone stays the body's
        self.transform = model.transform
        self.heads = nn.ModuleDict({k: getattr(model, k) for k in ("head", "anchor_generator", "rpn", "roi_heads")
                                    if isinstance(getattr(model, k, None), nn.Module)})
        with torch.no_grad():
            images, _ = model.transform([torch.zeros(3, size, size)])
        self.padded, self.resized, self.size, self.names = tuple(images.tensors.shape[-2:]), images.image_sizes[0], size, names

    def forward(self, *features: torch.Tensor) -> Detections:
        from torchvision.models.detection.image_list import ImageList

        model, n = self._model[0], features[0].shape[0]
        # The anchors need the padded batch's shape only: a broadcast zero stands in for it.
        images = ImageList(features[0].new_zeros(()).expand(n, 3, *self.padded), [self.resized] * n)
        if "rpn" in self.heads:  # Faster R-CNN: proposals, then the box head
            named = OrderedDict(zip(self.names, features))
            proposals, _ = self.heads["rpn"](images, named)
            detections, _ = self.heads["roi_heads"](named, proposals, images.image_sizes)
        else:  # SSD: class and box predictions per anchor
            maps = list(features)
            outputs = self.heads["head"](maps)
            anchors = self.heads["anchor_generator"](images, maps)
            detections = model.postprocess_detections(outputs, anchors, images.image_sizes)
        detections = self.transform.postprocess(detections, images.image_sizes, [(self.size, self.size)] * n)
        return pack(detections)


def _torchvision(name: str, num_classes: int, size: int, **options: Any) -> Detector:
    import torchvision.models.detection as tvd

    model = getattr(tvd, name)(weights=None, weights_backbone=None, num_classes=num_classes, **options).eval()
    body = _FeatureTuple(model.backbone)
    with torch.no_grad():
        names = list(model.backbone(torch.zeros(1, 3, 64, 64)).keys())
    return Detector(_TorchvisionPre(model.transform), body, _TorchvisionPost(model, size, names))


class _YoloxPost(nn.Module):
    """YOLOX's decoupled head and libreyolo's decoding and NMS, image by image."""

    def __init__(self, head: nn.Module, size: int) -> None:
        super().__init__()
        self.head, self.size = head, size

    def forward(self, *features: torch.Tensor) -> Detections:
        from libreyolo.postprocess.yolox import postprocess

        outputs = self.head(list(features))
        found = []
        for i in range(features[0].shape[0]):
            d = postprocess([o[i:i + 1] for o in outputs], conf_thres=SCORE_THRESHOLD, iou_thres=0.45,
                            input_size=self.size, max_det=MAX_DETECTIONS)
            if d["num_detections"]:  # libreyolo answers an image without detections with empty lists
                found.append({"boxes": torch.as_tensor(d["boxes"]).reshape(-1, 4),
                              "scores": torch.as_tensor(d["scores"]).reshape(-1),
                              "labels": torch.as_tensor(d["classes"]).reshape(-1).long()})
            else:
                found.append({"boxes": torch.zeros(0, 4), "scores": torch.zeros(0),
                              "labels": torch.zeros(0, dtype=torch.int64)})
        return pack(found)


def _yolox(config: str, num_classes: int, size: int) -> Detector:
    if importlib.util.find_spec("libreyolo") is None:
        raise UsageError(f"yolox_{config} needs libreyolo (MIT; pip install 'paretopipe[detection]'), which is not "
                         f"installed here")
    from libreyolo.models.yolox.nn import LibreYOLOXModel

    model = LibreYOLOXModel(config=config, nb_classes=num_classes).eval()
    return Detector(_ToPixels(255.0, bgr=True), model.backbone, _YoloxPost(model.head, size))


#: Detector name -> how to build it at its input size (names.DETECTORS holds the sizes, torch-free).
BUILDERS: dict[str, Callable[[int, int], Detector]] = {
    "ssdlite320_mobilenet_v3_large": lambda classes, size: _torchvision(
        "ssdlite320_mobilenet_v3_large", classes, size, score_thresh=SCORE_THRESHOLD),
    "fasterrcnn_mobilenet_v3_large_fpn": lambda classes, size: _torchvision(
        "fasterrcnn_mobilenet_v3_large_fpn", classes, size, box_score_thresh=SCORE_THRESHOLD),
    "yolox_n": lambda classes, size: _yolox("n", classes, size),
    "yolox_s": lambda classes, size: _yolox("s", classes, size),
}


def build(name: str, num_classes: int, size: int) -> Detector:
    """The detector ``name`` with torch's initialisation (the zoo then draws its weights portably)."""
    return BUILDERS[name](num_classes, size)


def same_detections(got: Detections, want: Detections, atol: float = 1e-5) -> float:
    """The largest difference between two detectors' outputs; infinite when the counts or the labels
    differ (a box that is missing or of another class is not a small error)."""
    if not torch.equal(got[3], want[3]) or not torch.equal(got[2], want[2]):
        return float("inf")
    return max(_largest_difference(got[0], want[0]), _largest_difference(got[1], want[1]))


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
