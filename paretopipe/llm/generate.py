"""Generation: the choice of the next token (greedy, or seeded sampling), the unsplit reference
(transformers' own model and cache), and a split run through in-process stages, which the tests
compare token by token and logit by logit."""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from .build import LMSource, build_stage, skeleton, _fill
from .shapes import check_plan
from .stage import LMStage, decode_cut, encode_cut


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Greedy when ``temperature`` is 0; else softmax(logits / T) over the ``top_k`` largest,
    drawn from a generator seeded by (seed, stream, step)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def choose(self, logits: torch.Tensor, stream: int, step: int) -> int:
        logits = logits.reshape(-1).to(torch.float32)
        if self.temperature <= 0:
            return int(torch.argmax(logits))
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.numel())).values[-1]
            logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
        gen = torch.Generator().manual_seed(int(hashlib.sha256(f"{self.seed}/{stream}/{step}".encode())
                                                .hexdigest()[:15], 16))
        return int(torch.multinomial(torch.softmax(logits / self.temperature, dim=-1), 1, generator=gen))


@torch.no_grad()
def reference_model(src: LMSource) -> torch.nn.Module:
    """The whole model as transformers builds it, with the same weights as the stages."""
    model = skeleton(src)
    model.to_empty(device="cpu")
    for prefix, module in [("model.embed_tokens", model.model.embed_tokens),
                           *((f"model.layers.{i}", layer) for i, layer in enumerate(model.model.layers)),
                           ("model.norm", model.model.norm), ("lm_head", model.lm_head)]:
        if not (prefix == "lm_head" and src.shape.tie_word_embeddings):
            _fill(src, prefix, module)
    if src.shape.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    return model.eval()


@torch.no_grad()
def generate_unsplit(model: torch.nn.Module, prompt: list[int], gen_tokens: int, sampling: Sampling = Sampling(),
                     stream: int = 0) -> tuple[list[int], list[torch.Tensor]]:
    """Tokens and each step's logits from transformers' forward with its own DynamicCache."""
    from transformers import DynamicCache  # lazy for start-up: transformers

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    tokens, logits = [], []
    for step in range(gen_tokens):
        out = model(input_ids=ids, cache=cache, use_cache=True)
        step_logits = out.logits[0, -1].clone()
        logits.append(step_logits)
        tokens.append(sampling.choose(step_logits, stream, step))
        ids = torch.tensor([[tokens[-1]]])
    return tokens, logits


def build_plan(src: LMSource, splits: list[int]) -> list[LMStage]:
    check_plan(src.shape, splits)
    return [LMStage(build_stage(src, splits, i)) for i in range(len(splits) + 1)]


def generate_split(stages: list[LMStage], prompt: list[int], gen_tokens: int, sampling: Sampling = Sampling(),
                   cut_dtype: str = "float32", stream: int = 0) -> tuple[list[int], list[torch.Tensor]]:
    """The same generation through in-process stages, each cut crossed as the wire carries it."""
    tokens, logits = [], []
    x, start = torch.tensor([prompt]), 0
    for step in range(gen_tokens):
        h = x
        for stage in stages:
            h = decode_cut(encode_cut(h, cut_dtype), cut_dtype) if stage is not stages[0] else h
            h = stage.forward(stream, h, start)
        logits.append(h[0].clone())
        tokens.append(sampling.choose(h[0], stream, step))
        start += x.shape[1]
        x = torch.tensor([[tokens[-1]]])
    return tokens, logits
