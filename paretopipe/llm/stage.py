"""One stage of a split LM at run time: its blocks, the KV cache of its own layers for every
stream (sequence), and its rotary embedding computed locally from the positions that cross."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..partition import wirequant
from .build import StageParts



class StageCache:
    """The keys and values of one stream in this stage's layers (numbered from 0): the object
    transformers' attention calls ``update`` on."""

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx in self.keys:
            key = torch.cat([self.keys[layer_idx], key], dim=-2)
            value = torch.cat([self.values[layer_idx], value], dim=-2)
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value

    def length(self) -> int:
        return next(iter(self.keys.values())).shape[-2] if self.keys else 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.keys, self.values) for t in d.values())


class LMStage:
    """Runs a stage's blocks on (part of) one stream's sequence. The first stage takes token ids;
    a later one the hidden state of the stage before; the last returns the last position's logits.
    On a CUDA ``device`` the blocks and the KV cache live there; what comes in and goes out is on
    the host, and a step's time includes both copies."""

    def __init__(self, parts: StageParts, device: str = "cpu") -> None:
        self.device = device
        self.cuda = device.startswith("cuda")
        if self.cuda:
            parts.to(device)
        self.parts = parts
        self.caches: dict[int, StageCache] = {}
        self.log: list[tuple[int, str, float]] = []  # (stream, phase, seconds) of every forward

    @property
    def first(self) -> bool:
        return self.parts.embed is not None

    @property
    def last(self) -> bool:
        return self.parts.lm_head is not None

    def reset(self) -> None:
        self.caches.clear()
        self.log = []

    def compute_s(self, phase: str, streams: int | None = None) -> list[float]:
        """This stage's compute times of a phase (prefill or decode), of streams below ``streams``
        (the measured ones: warm-up streams are numbered after them)."""
        return [s for stream, p, s in self.log if p == phase and (streams is None or stream < streams)]

    def kv_bytes(self) -> int:
        return sum(c.nbytes() for c in self.caches.values())

    @torch.inference_mode()
    def forward(self, stream: int, x: torch.Tensor, start: int, all_positions: bool = False) -> torch.Tensor:
        """``x``: token ids (1, T) for the first stage, else the hidden state (1, T, H) of the
        tokens at positions start .. start+T-1. The prefill (start 0) begins a stream's cache. The
        last stage returns the last position's logits, or every position's (1, T, V) with
        ``all_positions`` (a teacher-forced evaluation)."""
        t0 = time.perf_counter()
        p = self.parts
        if start == 0:  # a prefill begins the stream's sequence (a LoadGen query takes a slot in turn)
            self.caches[stream] = StageCache()
        cache = self.caches.setdefault(stream, StageCache())
        if cache.length() != start and p.decoder:
            raise ValueError(f"stream {stream}: this stage holds {cache.length()} positions, the input starts at {start}")
        if self.cuda:
            x = x.to(self.device, non_blocking=True)
        h = p.embed(x) if p.embed is not None else x  # ids pass through a stage of no blocks
        if len(p.decoder):
            positions = torch.arange(start, start + h.shape[1], device=h.device).unsqueeze(0)
            rotary = p.rotary(h, position_ids=positions)
            for layer in p.decoder:
                # No mask: a prefill starts the cache (SDPA's causal kernel), a decode step sees all of it.
                h = layer(h, attention_mask=None, position_ids=positions, cache=cache, use_cache=True,
                          position_embeddings=rotary)
        if p.norm is not None:
            h = p.norm(h)
        if p.lm_head is not None:
            h = p.lm_head(h) if all_positions else p.lm_head(h[:, -1:, :])[:, 0, :]
        if self.cuda:
            h = h.cpu()  # waits for the device: the step's time is its whole work
        self.log.append((stream, "prefill" if start == 0 else "decode", time.perf_counter() - t0))
        return h


def encode_cut(h: torch.Tensor, cut_dtype: str) -> tuple[torch.Tensor, ...]:
    """What crosses a cut for a hidden state: itself (token ids, float32), a cast, or its int8 or
    int4 parts (one float32 scale per 32 values of a token: paretopipe.partition.wirequant)."""
    if h.dtype == torch.int64 or cut_dtype == "float32":
        return (h.contiguous(),)
    if cut_dtype in wirequant.QUANTISED:
        return wirequant.quantise(h, cut_dtype)
    return (h.to(wirequant.CASTS[cut_dtype]).contiguous(),)


def decode_cut(tensors: tuple[torch.Tensor, ...], cut_dtype: str) -> torch.Tensor:
    """The hidden state (or token ids) from what crossed; quantised parts that disagree are refused."""
    if cut_dtype in wirequant.QUANTISED and tensors[0].dtype != torch.int64:
        return wirequant.dequantise(tensors, cut_dtype)
    t = tensors[0]
    return t if t.dtype == torch.int64 else t.to(torch.float32)


def cut_nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)

