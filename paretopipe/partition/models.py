"""Model zoo: names -> deterministic, responsive, eval-mode classification models.

Every node of a pipeline builds its own copy of the model from its name, so the weights must be
bit-identical everywhere without shipping a file, on an x86 server and on a Raspberry Pi's
aarch64 alike. Untrained ``weights=None`` models are unfit for both correctness checks (outputs
barely depend on the input) and timing (denormals), so the default weights are:

- every randomly initialised parameter drawn anew from a portable generator (numpy's PCG64,
  seeded per model and parameter name), as raw 64-bit integers turned into uniform float64
  values with exact arithmetic, then rounded once to float32. torch's own seeded init is not
  portable: x86 draws normals through a vectorised AVX2 path and aarch64 through a scalar one,
  so MobileNetV2's weights differed in the last bits (up to 5e-7) and the handshake refused a Pi
  talking to an x86 server. Constant parameters (BatchNorm's ones and zeros, class tokens) keep
  torch's init, which is exact everywhere;
- BatchNorm statistics calibrated on batches from the same portable generator, in float64,
  rounded to 12 mantissa bits, so that CPU-specific summation order cannot change a single bit;
- no all-zero heads, and the head scaled by an exact power of two.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from ..errors import UsageError
from . import detection, hubweights, weightcache
from .realmodels import build_real
# The names live in a torch-free module, so that commands which only check a name stay light; they
# are re-exported here because every caller that builds a model also names it.
from .names import (_CUSTOM, ANCHOR_ALIASES, DEFAULT_NUM_CLASSES, DETECTORS, ENTRY_POINT_GROUP, NAMED_MODELS, REAL_IMAGE_MODELS,
                    canonical_name, input_size,
                    is_model_file, known_models, normalize, register, source_digest)

__all__ = ["ANCHOR_ALIASES", "DETECTORS", "ENTRY_POINT_GROUP", "NAMED_MODELS", "build", "canonical_name", "construct",
           "default_weights_path", "fingerprint", "fingerprint_tensors", "input_size", "is_model_file", "known_models",
           "load_weights", "portable_seed",
           "normalize", "portable_stream", "portable_uniform", "register", "skeleton", "source_digest"]

MODELS_DIR_ENV = "PARETOPIPE_MODELS_DIR"
CALIBRATION_BATCHES = 2
CALIBRATION_BATCH_SIZE = 4
_ROUND_BITS = 12

def _seed_for(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def construct(canonical: str, num_classes: int) -> nn.Module:
    """The architecture with torch's own initialisation (seed it first for reproducible weights)."""
    key = normalize(canonical)
    if key in _CUSTOM:
        return _CUSTOM[key][1](num_classes)
    if canonical in DETECTORS:
        return detection.build(canonical, num_classes, DETECTORS[canonical])
    if canonical in REAL_IMAGE_MODELS:
        return build_real(canonical)  # its own trained head: --num-classes does not apply
    import torchvision.models as tvm

    kwargs: dict = {"weights": None, "num_classes": num_classes}
    if canonical == "inception_v3":
        # transform_input=True is what the anchor ran (pretrained Inception turns it on), and it is
        # the case that naive children() slicing gets silently wrong.
        kwargs.update(aux_logits=False, transform_input=True, init_weights=True)
    elif canonical == "googlenet":
        kwargs.update(aux_logits=False, init_weights=True)
    try:
        return tvm.get_model(canonical, **kwargs)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"torchvision cannot build {canonical!r} with num_classes={num_classes}: {exc}")


def skeleton(canonical: str, num_classes: int) -> nn.Module:
    """The architecture without weights, on the meta device (no memory, no init, no compute).

    Some builders compute with tensors while they are constructed (RegNet rounds its widths with
    tensor arithmetic), which the meta device cannot do ("Cannot copy out of meta tensor"): those
    are built for real once and then moved to the meta device, so that tracing them runs no
    forward pass (18 s for regnet_y_128gf's 128 GFLOPs otherwise).
    """
    if canonical in DETECTORS:
        # Their anchor generators keep plain tensors made at construction, which neither the meta
        # device nor a state dict would fill: built for real (torch's init, no forward pass).
        return construct(canonical, num_classes)
    try:
        with torch.device("meta"):
            return construct(canonical, num_classes)
    except (NotImplementedError, RuntimeError):
        return construct(canonical, num_classes).to("meta")


#: Values drawn at a time. Drawn whole, VGG16's 103-million-value layer made five passes over
#: 800 MB arrays: 6.8 s of one core where 2 MiB chunks, which stay in cache, take 0.5 s
#: (benchmarks/portable_draws.py).
_DRAW_CHUNK = 1 << 18


def portable_stream(seed: np.random.SeedSequence, shape: tuple[int, ...] | torch.Size, scale: float = 1.0,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """PCG64's stream from ``seed`` as values in [-scale, scale), the same bits on every CPU.

    PCG64 and numpy's SeedSequence are integer arithmetic; each raw 64-bit output keeps its top 53
    bits, scaled by 2**-52 and shifted by one: both exact in float64. The value is then multiplied
    by ``scale`` in float64 and rounded once to ``dtype`` (float32 or float64)."""
    bits = np.random.PCG64(seed)
    n = math.prod(shape)
    out = torch.empty(n, dtype=dtype)
    flat = out.numpy()
    for start in range(0, n, _DRAW_CHUNK):
        raw = bits.random_raw(min(_DRAW_CHUNK, n - start))
        raw >>= np.uint64(11)
        values = raw.astype(np.float64)
        values *= 2.0 ** -52
        values -= 1.0
        if scale != 1.0:
            values *= scale
        flat[start:start + values.size] = values
    return out.reshape(tuple(shape))


def portable_seed(*key: int | str) -> np.random.SeedSequence:
    """The seed of a portable draw: ints as they are, strings by the first 64 bits of their SHA-256."""
    return np.random.SeedSequence([int(hashlib.sha256(k.encode()).hexdigest()[:16], 16) if isinstance(k, str)
                                   else int(k) for k in key])


def portable_uniform(shape: tuple[int, ...] | torch.Size, *key: int | str, scale: float = 1.0,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """:func:`portable_stream` seeded by :func:`portable_seed` of ``key``."""
    return portable_stream(portable_seed(*key), shape, scale, dtype)


def _fan_in(tensor: torch.Tensor) -> int:
    return max(1, tensor.numel() // max(1, tensor.shape[0]))


@torch.no_grad()
def _portable_init(model: nn.Module, seed: int) -> None:
    """Draw every randomly initialised parameter anew from :func:`portable_uniform`.

    A parameter is random when torch's init left it non-constant, and the weights of every Linear
    and convolution are (zero-initialised heads, like ViT's, would make the output ignore the
    input). Weights (2 or more dimensions) get He's scale, sqrt(2 / fan_in); vectors (biases,
    drawn by torch as uniform in +-1/sqrt(fan_in) of their layer) that scale. Both are computed
    with IEEE-exact operations (sqrt, product, one rounding to float32)."""
    weights = {}
    for mod_name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() >= 2:
            weights[mod_name] = w
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if not p.is_floating_point() or p.numel() == 0:
            continue
        owner = name.rpartition(".")[0]
        forced = name.endswith("weight") and owner in weights and weights[owner] is p
        if not forced and bool((p == p.reshape(-1)[0]).all()):
            continue  # a constant: exact on every CPU already
        if p.dim() >= 2:
            bound = math.sqrt(3.0) * math.sqrt(2.0 / _fan_in(p))
        else:
            bound = 1.0 / math.sqrt(_fan_in(weights[owner]) if owner in weights else p.numel())
        exact = p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float64
        p.copy_(portable_uniform(p.shape, seed, name, scale=bound, dtype=exact))


def _calibration_batch(size: int, seed: int, index: int) -> torch.Tensor:
    """A float64 calibration batch with unit variance (uniform in +-sqrt(3)), the same on every CPU."""
    return portable_uniform((CALIBRATION_BATCH_SIZE, 3, size, size), seed, "calibration", index, scale=math.sqrt(3.0))


def _round_mantissa(t: torch.Tensor) -> torch.Tensor:
    mant, exp = torch.frexp(t)
    scale = float(2 ** _ROUND_BITS)
    return torch.ldexp(torch.round(mant * scale) / scale, exp)


def _through_last_norm(model: nn.Module) -> nn.Module | Callable[[torch.Tensor], Any]:
    """What calibration must run: a detector whose heads hold no BatchNorm stops after its body.
    Its heads see the statistics' outputs and feed nothing back, and Faster R-CNN's box head on
    a thousand proposals was 8 of its 20 s of calibration."""
    if isinstance(model, detection.Detector) and not any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.post.modules()):
        return lambda x: model.body(model.pre(x))
    return model


@torch.no_grad()
def _calibrate_batchnorm(model: nn.Module, size: int, seed: int) -> None:
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    model.double()
    model.eval()
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batches
        bn.train()
    forward = _through_last_norm(model)
    for i in range(CALIBRATION_BATCHES):
        forward(_calibration_batch(size, seed, i))
    for bn in bns:
        var = _round_mantissa(bn.running_var)
        # Means that are zero in exact arithmetic come out as +-1e-16 noise, which relative
        # rounding keeps; quantise them on a power-of-two grid tied to the channel's std instead.
        step = torch.exp2(torch.floor(torch.log2(var.clamp_min(1e-30).sqrt())) - _ROUND_BITS)
        bn.running_var.copy_(var)
        bn.running_mean.copy_(torch.round(bn.running_mean / step) * step + 0.0)  # -0.0 -> +0.0
        bn.momentum = 0.1
    model.float()
    model.eval()


@torch.no_grad()
def _scale_head(model: nn.Module, size: int, seed: int) -> None:
    """Scale the last Linear by a power of two so logits spread ~1: exact, so still bit-identical.

    Without BatchNorm (AlexNet, VGG) the signal shrinks layer by layer and logits end near 1e-3,
    where a 1e-5 tolerance would prove little.
    """
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not heads:
        return
    head = heads[-1]
    model.double()
    out = model(_calibration_batch(size, seed, CALIBRATION_BATCHES))
    model.float()
    spread = float(out.std())
    if spread > 0 and torch.isfinite(out).all():
        factor = 2.0 ** round(-torch.log2(torch.tensor(spread)).item())
        head.weight.mul_(factor)
        if head.bias is not None:
            head.bias.mul_(factor)


def default_weights_path(name: str, models_dir: str | os.PathLike | None = None) -> Path | None:
    """``models/<name>.pth`` (anchor or torchvision spelling) if such a file exists."""
    base = Path(models_dir or os.environ.get(MODELS_DIR_ENV, "models"))
    for candidate in (name, canonical_name(name), normalize(name)):
        path = base / f"{candidate}.pth"
        if path.is_file():
            return path
    return None


def load_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Load a state dict with ``weights_only=True``; fail naming the keys/shapes that differ."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"weights file not found: {path}")
    except IsADirectoryError:
        raise UsageError(f"weights {path} is a folder; give a .pth file")
    except Exception as exc:  # a corrupt file or one holding pickled objects: torch's text is long
        first = " ".join(str(exc).split())[:160]
        raise UsageError(f"cannot load weights {path} safely (weights_only=True): {first}; give a state-dict .pth "
                         f"saved with torch.save(model.state_dict())")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"weights file {path} does not hold a state dict (it holds {type(state).__name__}); "
                         f"save one with torch.save(model.state_dict())")
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise UsageError(f"weights file {path} is not a state dict: key {str(bad[0])[:40]!r} is not a parameter name "
                         f"with a tensor; save one with torch.save(model.state_dict())")
    own = model.state_dict()
    # Pretrained Inception/GoogLeNet files carry auxiliary heads that our eval models drop.
    state = {k: v for k, v in state.items() if k in own or not k.startswith(("AuxLogits.", "aux1.", "aux2."))}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
             for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys (e.g. {', '.join(unexpected[:3])})")
        if wrong:
            parts.append(f"{len(wrong)} shape mismatches (e.g. {'; '.join(wrong[:3])})")
        raise UsageError(f"weights {path} do not fit the model: {'; '.join(parts)} "
                         f"(check --num-classes and the model name)")
    model.load_state_dict(state, strict=True)


def build(name: str, num_classes: int = DEFAULT_NUM_CLASSES, weights: str | os.PathLike | None = None,
          models_dir: str | os.PathLike | None = None, calibrate: bool = True) -> nn.Module:
    """Build ``name`` in eval mode with identical weights on every machine.

    ``weights``: a ``.pth`` path to load; ``None`` loads ``models/<name>.pth`` when present and
    otherwise uses the deterministic responsive initialisation, cached on disk
    (:mod:`paretopipe.partition.weightcache`). ``calibrate=False`` skips that initialisation:
    for structure only (cut points, shapes, FLOPs), never for outputs or timing.
    """
    canonical = canonical_name(name)
    if hubweights.is_weight_name(weights):
        path, num_classes = hubweights.resolve(canonical, str(weights))  # torchvision's trained head
    else:
        path = Path(weights) if weights else default_weights_path(name, models_dir)
    if num_classes < 1:
        raise UsageError(f"--num-classes {num_classes}: must be at least 1")
    seed = _seed_for(canonical)

    def fresh() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the constants' init; every random value is drawn portably below
            model = construct(canonical, num_classes)
            if path is not None:
                load_weights(model, path)
            elif calibrate:
                _portable_init(model, seed)
                _calibrate_batchnorm(model, input_size(name), seed)
                if canonical not in DETECTORS:  # a detector's last Linear regresses boxes: no logits to spread
                    _scale_head(model, input_size(name), seed)
        return model

    digest = source_digest(canonical)
    # @register models live only in this process's code, which may change under the same name:
    # built afresh. Files and entry points are cached under their source's digest.
    if canonical in REAL_IMAGE_MODELS and path is None:
        model = construct(canonical, num_classes)  # trained weights from its package (0.2 s to load)
    elif path is not None or not calibrate or (normalize(canonical) in _CUSTOM and digest is None):
        model = fresh()
    else:
        model, _ = weightcache.cached_build(weightcache.cache_key(canonical, num_classes, seed, digest),
                                            lambda: skeleton(canonical, num_classes),
                                            fresh, fingerprint)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def fingerprint(module: nn.Module) -> str:
    """Short sha256 over names, dtypes, shapes and bytes of the state dict."""
    return fingerprint_tensors(module.state_dict())


def fingerprint_tensors(named: dict[str, torch.Tensor]) -> str:
    """:func:`fingerprint` of named tensors (a state dict, or a model's weights by name)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(named.items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]
