"""A stage's parts of a decoder-only LM, and nothing of the others': the model is laid out on the
meta device (no memory), and only the blocks a stage holds are made real and filled, from the
portable generator or from a local folder's safetensors.

Default weights: every matrix and bias drawn from :func:`partition.models.portable_stream`
(PCG64, seeded per model and parameter name, exact on x86 and aarch64 alike) at the scales
:func:`_bound` explains, norms at one as transformers leaves them. Drawing by parameter name is what lets a stage build only its own parameters and
still hold the same bits as the whole model built on another machine."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import UsageError
from ..partition.models import fingerprint as module_fingerprint, portable_seed, portable_stream
from . import blockcache
from .checkpoints import check_architecture, display_name, folder_config, is_real
from .shapes import LMShape, named, shape_from_config, stage_blocks, stage_layers

GENERATOR = "portable-uniform-v1/embed0.1/gain2"
INIT_STD = 0.02       # biases, as transformers' initializer_range
EMBED_STD = 0.1
RESIDUAL_GAIN = 2.0


@dataclasses.dataclass
class LMSource:
    """Where a model's shape and weights come from: a named shape (portable weights) or a folder."""

    shape: LMShape
    model_dir: Path | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.shape.name

    def identity(self) -> str:
        """What two stages must share, as a short digest: the configuration and how the weights
        were made (the generator, or every byte of the folder's weight files)."""
        digest = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode())
        if self.model_dir is None:
            digest.update(GENERATOR.encode())
        else:
            for path in weight_files(self.model_dir):
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 24), b""):
                        digest.update(chunk)
        return digest.hexdigest()[:16]


def source(model: str | None, model_dir: str | None = None) -> LMSource:
    """A named shape (portable weights), or trained weights: a folder (config.json and
    safetensors), a GGUF file, a hub id from the local cache, or a named real model
    (:mod:`paretopipe.llm.checkpoints`)."""
    if model_dir is None and not is_real(model):
        shape = named(model or "")
        return LMSource(shape, None, {**shape.config_dict(), "initializer_range": INIT_STD})
    folder, config, what = folder_config(model, model_dir)
    if not weight_files(folder):
        raise UsageError(f"{what}: no *.safetensors weights there")
    check_architecture(config, what)
    src = LMSource(shape_from_config(config, display_name(model, model_dir)), folder, config)
    skeleton(src)  # the layout is checked before anything listens (the meta device: no memory)
    return src


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def hf_config(src: LMSource):
    """The transformers configuration, with attention by torch's SDPA (the same kernel everywhere)."""
    from transformers import AutoConfig  # lazy for start-up: transformers

    config = AutoConfig.for_model(**src.config)
    config._attn_implementation = "sdpa"
    return config


def skeleton(src: LMSource) -> nn.Module:
    """The whole causal LM on the meta device: its layout, no memory."""
    from transformers import AutoModelForCausalLM  # lazy for start-up: transformers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(src))
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) or not hasattr(model, "lm_head"):
        raise UsageError(f"{src.name}: this architecture ({src.shape.architecture}) does not have the layout of a "
                         f"decoder-only LM ParetoPipe splits (embed_tokens, layers, norm, rotary_emb, lm_head)")
    return model


@dataclasses.dataclass
class StageParts:
    """What one stage holds: its blocks' modules (None for blocks it does not hold)."""

    blocks: tuple[int, int]
    layers: range
    embed: nn.Embedding | None
    decoder: nn.ModuleList
    norm: nn.Module | None
    lm_head: nn.Linear | None
    rotary: nn.Module | None
    config: Any

    def modules(self) -> nn.ModuleDict:
        named_parts = {"embed": self.embed, "norm": self.norm, "lm_head": self.lm_head}
        out = nn.ModuleDict({k: v for k, v in named_parts.items() if v is not None})
        out["layers"] = self.decoder
        return out

    def fingerprint(self) -> str:
        return module_fingerprint(self.modules())

    def to(self, device: str) -> "StageParts":
        """Move every block (and the rotary embedding's buffers) to ``device``, in place."""
        for module in (self.embed, self.decoder, self.norm, self.lm_head, self.rotary):
            if module is not None:
                module.to(device)
        return self

    def param_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.modules().parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        return total


def build_stage(src: LMSource, splits: list[int], index: int) -> StageParts:
    """Stage ``index`` (0-based) of the plan ``splits``: only its blocks are made real."""
    model = skeleton(src)
    shape = src.shape
    first, end = stage_blocks(shape, splits, index)
    layers = stage_layers(shape, splits, index)
    holds = lambda block: first <= block < end  # noqa: E731
    inner = model.model
    wanted: dict[str, nn.Module] = {}
    embed = inner.embed_tokens if holds(0) else None
    lm_head = model.lm_head if holds(shape.num_blocks - 1) else None
    norm = inner.norm if holds(shape.num_hidden_layers + 1) else None
    if embed is not None:
        wanted["model.embed_tokens"] = embed
    for i in layers:
        wanted[f"model.layers.{i}"] = inner.layers[i]
    if norm is not None:
        wanted["model.norm"] = norm
    if lm_head is not None:
        wanted["lm_head"] = lm_head
    tied = shape.tie_word_embeddings
    for prefix, module in wanted.items():
        if prefix == "lm_head" and tied and embed is not None:
            continue  # the same tensor as the embedding, filled once
        module.to_empty(device="cpu")
        _fill(src, prefix, module)
    if lm_head is not None and tied:
        lm_head.weight = embed.weight if embed is not None else lm_head.weight
    decoder = nn.ModuleList(inner.layers[i] for i in layers)
    for local, layer in enumerate(decoder):
        layer.self_attn.layer_idx = local  # this stage's KV cache numbers its own layers from 0
    rotary = type(inner.rotary_emb)(config=model.config) if len(layers) else None
    parts = StageParts((first, end), layers, embed, decoder, norm, lm_head, rotary, model.config)
    for module in parts.modules().modules():
        module.eval()
    for p in parts.modules().parameters():
        p.requires_grad_(False)
    return parts


@torch.no_grad()
def _fill(src: LMSource, prefix: str, module: nn.Module) -> None:
    """Fill a block's parameters (and persistent buffers) by their names in the whole model."""
    tensors = dict(module.named_parameters(recurse=True))
    if src.model_dir is not None:
        _fill_from_folder(src, prefix, module, tensors)
        return

    def draw(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        full = f"{prefix}.{name}"
        if name.endswith("norm.weight") or name == "weight" and prefix.endswith("norm"):
            return torch.ones(shape)  # RMSNorm's scale: transformers' init, exact everywhere
        if full == "lm_head.weight" and src.shape.tie_word_embeddings:
            full = "model.embed_tokens.weight"
        return portable_values(shape, src.name, full) * _bound(full, tensors[name])

    shapes = {name: tuple(p.shape) for name, p in tensors.items()}
    values = blockcache.block_values(src.name, src.identity(), prefix, shapes, draw)
    for name, p in tensors.items():
        p.copy_(values[name])


def _bound(full: str, p: torch.Tensor) -> float:
    """Uniform bounds of the default weights (a uniform in +-b has a standard deviation b/sqrt(3)).
    transformers' own init (all 0.02) makes an untrained model echo its last prompt token: the
    tied embedding's self-product outweighs what the layers add. So the layers keep their input's
    variance (1/fan_in), the residual branches' outputs count twice, the embeddings are 0.1: the
    generated tokens then vary along the sequence and with the prompt."""
    if "embed_tokens" in full or full.startswith("lm_head"):
        return EMBED_STD * math.sqrt(3.0)
    if p.dim() >= 2:
        gain = RESIDUAL_GAIN if full.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
        return gain * math.sqrt(3.0 / p.shape[1])
    return INIT_STD * math.sqrt(3.0)


def portable_values(shape: torch.Size | tuple[int, ...], *key: str) -> torch.Tensor:
    """Uniform values in [-1, 1), as float32, the same bits on every CPU (the stream of
    :func:`partition.models.portable_stream`, seeded by every key's SHA-256)."""
    return portable_stream(portable_seed(*key), shape, dtype=torch.float32)


def _fill_from_folder(src: LMSource, prefix: str, module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors import safe_open  # lazy for start-up: safetensors

    wanted = {f"{prefix}.{n}": p for n, p in tensors.items()}
    if prefix == "lm_head" and src.shape.tie_word_embeddings:
        wanted = {"model.embed_tokens.weight": tensors["weight"]}
    found: set[str] = set()
    for path in weight_files(src.model_dir):
        with safe_open(str(path), framework="pt") as fh:
            for key in set(fh.keys()) & set(wanted):
                value = fh.get_tensor(key)
                if tuple(value.shape) != tuple(wanted[key].shape):
                    raise UsageError(f"{path.name}: {key} has shape {tuple(value.shape)}, config.json implies "
                                     f"{tuple(wanted[key].shape)}")
                wanted[key].copy_(value.to(wanted[key].dtype))
                found.add(key)
    missing = sorted(set(wanted) - found)
    if missing:
        raise UsageError(f"--model-dir {src.model_dir}: the weights lack {missing[0]}"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))


def block_weights(src: LMSource, prefix: str) -> dict[str, torch.Tensor]:
    """One block's default weights by their names in the whole model (``model.layers.0``,
    ``model.norm``, ...), as transformers lays the block out."""
    model = skeleton(src)
    module = model.get_submodule(prefix)
    module.to_empty(device="cpu")
    _fill(src, prefix, module)
    return {f"{prefix}.{n}": p.detach() for n, p in module.named_parameters()}


def expected_block_weights(shape: LMShape, prefix: str) -> dict[str, torch.Tensor]:
    """The same weights from the shape alone, without transformers: the names and shapes a llama
    or qwen2 block has, each filled as :func:`_fill` fills it. What an aarch64 host (no
    transformers there) computes for the golden fingerprints."""
    h, hd, i = shape.hidden_size, shape.kv_head_dim, shape.intermediate_size
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    if prefix.startswith("model.layers."):
        names = {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
                 "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
                 "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
                 "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
        if shape.architecture == "qwen2":
            names.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    elif prefix == "model.norm":
        names = {"weight": (h,)}
    elif prefix in ("model.embed_tokens", "lm_head"):
        names = {"weight": (shape.vocab_size, h)}
    else:
        raise UsageError(f"{prefix}: not a block of {shape.name}")
    out = {}
    for name, dims in names.items():
        full = f"{prefix}.{name}"
        if name.endswith("norm.weight") or prefix == "model.norm":
            out[full] = torch.ones(dims)
            continue
        drawn = "model.embed_tokens.weight" if full == "lm_head.weight" and shape.tie_word_embeddings else full
        p = torch.empty(dims)
        out[full] = portable_values(dims, shape.name, drawn) * _bound(drawn, p)
    return out


def golden_blocks(shape: LMShape) -> list[str]:
    """The blocks the golden file fingerprints: all of the test model's, and the first and last
    layers and the final norm of the others (their embeddings are hundreds of megabytes)."""
    if shape.name == "tiny-lm":
        return ["model.embed_tokens", *(f"model.layers.{i}" for i in range(shape.num_hidden_layers)), "model.norm"]
    return ["model.layers.0", f"model.layers.{shape.num_hidden_layers - 1}", "model.norm"]

