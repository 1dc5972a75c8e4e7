"""A language model's stages as the runtime asks for any model's: the same face as an image
model's :class:`~paretopipe.partition.stages.StageBuilder` (a name, a fingerprint, a device, the
cuts and what crosses them, a stage for any plan), so the stage processes, both backends and the
sweeper hold either kind of model alike.

Its cuts are named ``lm<k>`` (split k: the first k blocks on stage 1). A process holds the stage
of one plan at a time, built from the model's shape and only its own blocks' weights."""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..errors import UsageError
from .build import LMSource, build_stage, source
from .shapes import (LMShape, block_params, check_plan, check_split, cut_bytes_per_token, cut_name, split_of,
                     stage_blocks, stage_layers)
from .stage import LMStage
from .prompts import prompt_ids, tokenizer_for


class LMPartitioner:
    """A language model's cut table in the partitioner's terms: ``num_blocks`` is its largest split
    (an image model's K), each cut's payload is per token of the hidden state (or ids) at float32."""

    #: A language model is cut between its blocks only: none of an image graph's fine cuts.
    fine_cuts: tuple = ()

    def __init__(self, shape: LMShape) -> None:
        self.shape = shape
        self.num_blocks = shape.last_split

    def block_cut(self, k: int) -> str:
        return cut_name(check_split(self.shape, k))

    def block_cuts(self) -> list[str]:
        return [cut_name(k) for k in range(self.num_blocks + 1)]

    def payload_nbytes(self, cut: str, tokens: int) -> int:
        """What ``tokens`` tokens send across ``cut`` at float32 (token ids at split 0)."""
        return cut_bytes_per_token(self.shape, split_of(cut)) * tokens


class LMBuilder:
    """Hands out a language model's stages for any plan, as a StageBuilder does an image model's."""

    def __init__(self, model: str | None, model_dir: str | None = None, device: str = "cpu") -> None:
        if device != "cpu" and not device.startswith("cuda"):
            raise UsageError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"--device {device} asked for but CUDA is not available on this node; use cpu")
        self.src: LMSource = source(None if model_dir else model, model_dir)
        self.shape = self.src.shape
        self.name = self.src.name
        self.model_dir = model_dir
        self.fingerprint = self.src.identity()
        self.num_classes = self.shape.vocab_size  # the handshake's head: a peer with another vocabulary differs
        self.device = device
        self.input_size = None
        self.partitioner = LMPartitioner(self.shape)
        self.tokenizer = tokenizer_for(self.src.model_dir)
        self._built: dict[tuple[tuple[int, ...], int], LMStage] = {}
        self._lock = threading.Lock()

    def cuts_for(self, split_index: int | None = None, cut: str | None = None) -> list[str]:
        """The cut list of a split (an image model's fine cuts have no counterpart here)."""
        if cut is not None:
            raise UsageError(f"--cut {cut}: a language model is split between its blocks; give --split K "
                             f"(python -m paretopipe split --model {self.name} --list)")
        if split_index is None:
            raise UsageError(f"give --split K, 0..{self.partitioner.num_blocks} for {self.name}")
        return [self.partitioner.block_cut(split_index)]

    def plan(self, cuts: list[str]) -> list[int]:
        return check_plan(self.shape, [split_of(c) for c in cuts])

    def stage(self, cuts: list[str], index: int) -> LMStage:
        """Stage ``index`` of the plan ``cuts``, built on first use; a process keeps one plan's
        stage at a time (it holds its own blocks only). Its KV caches live until :meth:`LMStage.reset`."""
        key = (tuple(self.plan(list(cuts))), index)
        with self._lock:
            if key not in self._built:
                self._built.clear()
                self._built[key] = LMStage(build_stage(self.src, list(key[0]), index), self.device)
            return self._built[key]

    def prompts(self, generation: Any, seed: int) -> list[list[int]]:
        """Each measured stream's prompt as token ids (the text's, or a seeded one per stream)."""
        g = generation
        return [prompt_ids(g.prompt, g.prompt_len, self.shape.vocab_size, self.shape.max_position_embeddings,
                           g.gen_tokens, self.tokenizer, seed, s, chat=g.chat) for s in range(g.streams)]

    def stage_memory(self, cfg: Any, index: int) -> dict[str, int]:
        """What stage ``index`` holds in a run: its parameters, and (as its activation peak) every
        stream's KV cache at the full context, prompt and generated tokens."""
        splits = self.plan(list(cfg.cuts))
        first, end = stage_blocks(self.shape, splits, index)
        params = block_params(self.shape)
        held = sum(params[first:end])
        if self.shape.tie_word_embeddings and first == 0 and end == self.shape.num_blocks:
            held -= params[-1]  # one matrix for the embedding and the head
        g = cfg.generation
        context = max(len(p) for p in self.prompts(g, cfg.seed)) + g.gen_tokens
        layers = len(stage_layers(self.shape, splits, index))
        kv = self.shape.kv_bytes_per_token(layers) * context * g.streams
        return {"param_bytes": 4 * held, "activation_peak_bytes": kv}
