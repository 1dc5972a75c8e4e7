"""A language model's generation on the one runtime: what its batches carry and how each stage
computes one, for both backends.

A generation's batch is one step of one stream: a prefill (the stream's prompt) or a decode step
(one token). What crosses a cut is the hidden state (``--wire-dtype``: float32, float16, bfloat16,
or int8 with one float32 scale per 32 values of a token), or token ids at split 0, with the step's
place in its meta (``stream``, ``start``: the position its tokens begin at, ``step``). Each stage
keeps the KV cache of its own layers for every stream. The last stage chooses the token and returns
it in the result's meta; stage 1 feeds it into the stream's next step (the schedule's feedback edge,
:func:`paretopipe.transport.pipeline.generation_actions`).

:class:`GenerationStage` is any stage's part of a run (checking what arrives, computing, encoding,
choosing, its record part); :class:`PromptFeed` is the data source's (the prompts, the tokens that
come back, the steps' places). Nothing here knows a socket or a rank.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Iterable

import torch

from ..errors import PeerError, WireError
from ..llm.builder import LMBuilder
from ..partition import wirequant
from ..partition.stages import adopt_torch_threads
from ..llm.generate import Sampling, reference_model
from ..llm.shapes import stage_blocks, stage_layers
from ..llm.stage import decode_cut, encode_cut
from . import pipeline
from .runconfig import WARMUP_PROMPT_TOKENS, WARMUP_TOKENS, RunConfig

#: What a step's wire frame names beside its tensor.
STEP_META = ("stream", "start", "step")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class GenerationStage:
    """Stage ``index`` (0-based) of a generation run: its stage of the plan (KV caches reset at the
    run's start), and every check on what a peer sends it before it is used."""

    def __init__(self, builder: LMBuilder, cfg: RunConfig, index: int) -> None:
        self.builder, self.cfg, self.index = builder, cfg, index
        self.g = cfg.generation
        self.splits = builder.plan(list(cfg.cuts))
        self.last = index == len(self.splits)
        self.stage = builder.stage(list(cfg.cuts), index)
        self.stage.reset()
        self.first_block = stage_blocks(builder.shape, self.splits, index)[0]
        self.sampling = Sampling(self.g.temperature, self.g.top_k, cfg.seed)
        self.logits: dict[tuple[int, int], torch.Tensor] = {}  # (stream, step) -> what the last stage chose from
        self.streams = self.g.streams + self.g.warmup_streams

    # -- what arrives --------------------------------------------------------------------------
    def step_of(self, seq: int, meta: Any) -> tuple[int, int, int]:
        """(stream, start, step) of an arriving step, each in range, or one line saying what is not."""
        stream, start, step = ((meta or {}).get(k) for k in STEP_META) if isinstance(meta, dict) else (None,) * 3
        steps = max(self.g.gen_tokens, WARMUP_TOKENS)
        if not (_whole(stream) and _whole(start) and _whole(step)) or stream >= self.streams or step >= steps:
            raise WireError(f"step {seq}: a TENSOR must name a stream 0..{self.streams - 1}, a start position and a "
                            f"step 0..{steps - 1}")
        return stream, start, step

    def stage_input(self, seq: int, tensor: Any, start: int) -> torch.Tensor:
        """What crossed into this stage, checked and decoded: token ids (split 0) or a hidden state
        of the model's width, in the run's wire dtype, at positions the model has, finite."""
        tensors = tensor if isinstance(tensor, tuple) else (tensor,)
        if any(t is None for t in tensors):
            raise WireError(f"step {seq}: a TENSOR without its tensor")
        shape = self.builder.shape
        if self.first_block == 0:
            t = tensors[0]
            if len(tensors) != 1 or t.dtype != torch.int64 or t.dim() != 2 or t.shape[0] != 1 or t.shape[1] < 1:
                raise WireError(f"step {seq}: split 0 carries token ids as int64 (1, T), got {t.dtype} {tuple(t.shape)}")
            if bool(((t < 0) | (t >= shape.vocab_size)).any()):
                raise WireError(f"step {seq}: a token id outside the vocabulary of {shape.vocab_size}")
            return t.clone()
        dtype, hidden = self.cfg.wire_dtype, shape.hidden_size
        parts_ok = tuple(x.dtype for x in tensors) == wirequant.PART_DTYPES[dtype]
        dims = wirequant.decoded_shape(tensors, dtype) if parts_ok else ()
        if len(dims) != 3 or dims[0] != 1 or dims[1] < 1 or dims[2] != hidden:
            raise WireError(f"step {seq}: expected a hidden state (1, T, {hidden}) as {dtype}, got "
                            f"{' + '.join(f'{x.dtype} {tuple(x.shape)}' for x in tensors)}")
        if start + dims[1] > shape.max_position_embeddings:
            raise WireError(f"step {seq}: positions past the model's {shape.max_position_embeddings}")
        x = decode_cut(tuple(x.clone() for x in tensors), dtype)  # the parts' agreement is checked there
        if not bool(torch.isfinite(x).all()):
            raise WireError(f"step {seq}: the hidden state holds NaN or infinity")
        return x

    # -- computing -----------------------------------------------------------------------------
    def forward(self, seq: int, stream: int, x: torch.Tensor, start: int) -> tuple[torch.Tensor, float]:
        """This stage's blocks on one step, and the seconds they took (copies to and from a GPU included)."""
        adopt_torch_threads()
        t0 = time.perf_counter()
        try:
            out = self.stage.forward(stream, x, start)
        except ValueError as exc:  # a step out of its stream's place: the peer's fault
            raise WireError(f"step {seq}: {exc}")
        return out, time.perf_counter() - t0

    def encode(self, h: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """What this stage's output sends across the next cut (the run's wire dtype)."""
        tensors = encode_cut(h, self.cfg.wire_dtype)
        return tensors[0] if len(tensors) == 1 else tensors

    def choose(self, logits: torch.Tensor, stream: int, step: int) -> int:
        """The last stage's token; a measured step's logits are kept for the exactness check."""
        if self.g.check_exact and stream < self.g.streams:
            self.logits[(stream, step)] = logits[0].clone()
        return self.sampling.choose(logits[0], stream, step)

    # -- after the run ---------------------------------------------------------------------------
    def part(self, sequences: Any = None) -> dict[str, Any]:
        """This stage's ``generation`` part of the record: its blocks and layers, its KV cache over
        the measured streams, its parameters and weights; the last stage's exactness check, given
        the streams' token ids (stage 1's)."""
        shape, st = self.builder.shape, self.stage
        measured = [c for s, c in st.caches.items() if s < self.g.streams]
        layers = stage_layers(shape, self.splits, self.index)
        first, end = stage_blocks(shape, self.splits, self.index)
        out: dict[str, Any] = {"blocks": [first, end], "layers": [layers.start, layers.stop],
                               "kv_bytes": sum(c.nbytes() for c in measured),
                               "kv_tokens": sum(c.length() for c in measured) if len(layers) else 0,
                               "param_bytes": st.parts.param_bytes(), "weights_fingerprint": st.parts.fingerprint()}
        if self.last and self.g.check_exact and sequences is not None:
            out["exactness"] = self.exactness(sequences)
        return out

    def exactness(self, sequences: Any) -> dict[str, Any]:
        """Token agreement and the largest logit difference against the unsplit float32 model, fed
        the run's own tokens (teacher-forced), so every step is compared on the same context."""
        g, vocab = self.g, self.builder.shape.vocab_size
        if not (isinstance(sequences, list) and len(sequences) == g.streams and all(
                isinstance(s, list) and len(s) > g.gen_tokens and all(_whole(t) and t < vocab for t in s)
                for s in sequences)):
            raise WireError(f"stage 1's RECORDS must carry {g.streams} streams' token ids for the exactness check")
        reference = reference_model(self.builder.src)
        agree, steps, worst = 0, 0, 0.0
        with torch.inference_mode():
            for stream, seq in enumerate(sequences):
                prompt = len(seq) - g.gen_tokens
                logits = reference(input_ids=torch.tensor([seq[:-1]])).logits[0]
                for step in range(g.gen_tokens):
                    ref, got = logits[prompt - 1 + step], self.logits.get((stream, step))
                    if got is None:
                        raise WireError(f"no logits kept for stream {stream} step {step}")
                    worst = max(worst, float((ref - got.to(ref.device)).abs().max()))
                    agree += self.sampling.choose(ref, stream, step) == seq[prompt + step]
                    steps += 1
        return {"reference": "the unsplit model in float32, teacher-forced on the generated tokens",
                "token_agreement": agree / steps, "max_logit_diff": worst, "steps": steps}


class PromptFeed:
    """The data source's side of a generation: the schedule, each step's input (a stream's prompt,
    then the token its previous step came back with) and its place, and the tokens as they land."""

    def __init__(self, builder: LMBuilder, cfg: RunConfig) -> None:
        g = cfg.generation
        self.cfg, self.g, self.builder = cfg, g, builder
        self.vocab = builder.shape.vocab_size
        self.steps = pipeline.generation_steps(g.streams, g.gen_tokens, g.warmup_streams, WARMUP_TOKENS)
        prompts = builder.prompts(g, cfg.seed)
        self.prompts = {s: p for s, p in enumerate(prompts)}
        self.prompts.update({g.streams + w: prompts[0][:WARMUP_PROMPT_TOKENS] for w in range(g.warmup_streams)})
        self.position = dict.fromkeys(self.prompts, 0)
        self.tokens: dict[int, int] = {}  # seq -> the token its result carried
        self._landed = threading.Condition()

    @functools.cached_property
    def stage(self) -> GenerationStage:
        """Stage 1, built where the data source computes it (an RPC master that only holds the
        prompts never does)."""
        return GenerationStage(self.builder, self.cfg, 0)

    def actions(self, check: Callable[[], None] = lambda: None) -> Iterable[pipeline.Action]:
        """The schedule of the streams' steps (``check`` is for a schedule that waits for its load)."""
        return pipeline.generation_actions(self.steps)

    def wait_for(self, seq: int, check: Callable[[], None], timeout_s: float) -> None:
        """``feedback``: block until the step ``seq`` feeds on has its token (``check`` raises when
        the run failed meanwhile)."""
        source = self.steps[seq].feeds_on
        deadline = time.monotonic() + timeout_s
        with self._landed:
            while source not in self.tokens:
                self._landed.wait(0.05)
                check()
                if time.monotonic() > deadline:
                    raise PeerError(f"no token for step {source} within {timeout_s:g}s (timeout)")

    def load(self, seq: int) -> tuple[int, int, torch.Tensor]:
        """(stream, start, ids) of step ``seq``: its prompt, or the token fed back."""
        step = self.steps[seq]
        ids = self.prompts[step.stream] if step.feeds_on is None else [self.tokens[step.feeds_on]]
        start = self.position[step.stream]
        self.position[step.stream] += len(ids)
        return step.stream, start, torch.tensor([ids], dtype=torch.int64)

    def fields(self, seq: int, start: int) -> dict[str, Any]:
        """What a step's batch record says of its place."""
        step = self.steps[seq]
        return {"stream": step.stream, "step": step.step, "position": start}

    def meta(self, seq: int, start: int) -> dict[str, int]:
        step = self.steps[seq]
        return {"stream": step.stream, "start": start, "step": step.step}

    def token_of(self, seq: int, meta: Any) -> int:
        """The token a result carries, checked against the step it answers."""
        token = meta.get("token") if isinstance(meta, dict) else None
        if not (isinstance(meta, dict) and 0 <= seq < len(self.steps) and meta.get("stream") == self.steps[seq].stream
                and _whole(token) and token < self.vocab):
            raise WireError(f"the result of step {seq} must name its stream and a token id below {self.vocab}")
        return token

    def landed(self, seq: int, token: int) -> None:
        with self._landed:
            self.tokens[seq] = token
            self._landed.notify_all()

    def part(self) -> dict[str, Any]:
        """Stage 1's ``generation`` part: the measured streams' prompt lengths and generated tokens
        (their sequences too, for the last stage's exactness check)."""
        g = self.g
        generated = {s: [] for s in range(g.streams)}
        for seq, step in enumerate(self.steps):
            if step.stream < g.streams and seq in self.tokens:
                generated[step.stream].append(self.tokens[seq])
        out: dict[str, Any] = {"prompt_tokens": [len(self.prompts[s]) for s in range(g.streams)],
                               "tokens": [generated[s] for s in range(g.streams)]}
        if g.check_exact:
            out["sequences"] = [self.prompts[s] + generated[s] for s in range(g.streams)]
        return out


class LocalTail:
    """Stage 1's own rest of the model for a generation that lives through a fault (a guarded run,
    ``--deadline-ms``): a step whose token does not come in time is finished here. Every step's
    tensor at the cut is kept as the wire delivers it (so a lossy wire dtype rounds it as stage 2
    would see it); a step finished here after one that stage 2 finished first rebuilds this tail's
    cache of the stream from those tensors (one prefill of the stream so far), and the next ones
    go on from it. A stage 2 that comes back without the stream's positions (a new process after a
    kill) is sent them the same way (:meth:`since`), so every stage's cache holds every position."""

    def __init__(self, builder: LMBuilder, cfg: RunConfig) -> None:
        self.builder, self.cfg = builder, cfg
        g = cfg.generation
        self.sampling = Sampling(g.temperature, g.top_k, cfg.seed)
        self.ids = stage_blocks(builder.shape, builder.plan(list(cfg.cuts)), 1)[0] == 0  # token ids cross, exactly
        self.history: dict[int, list[torch.Tensor]] = {}  # stream -> each step's tensor at the cut
        self.cached: dict[int, int] = {}  # stream -> positions this tail's cache holds, while current

    @functools.cached_property
    def stage(self) -> Any:
        """Every block after the first cut, built on the first step finished here."""
        return self.builder.stage([self.cfg.cuts[0]], 1)

    def computed(self, stream: int, start: int, out: torch.Tensor) -> None:
        """Stage 1's output of a step (positions ``start``..), as the next stage will read it."""
        kept = out if self.ids else decode_cut(encode_cut(out, self.cfg.wire_dtype), self.cfg.wire_dtype)
        steps = self.history.setdefault(stream, [])
        if start == 0:
            steps.clear()
        steps.append(kept.detach().clone())

    def since(self, stream: int, position: int) -> torch.Tensor:
        """The stream's tensors at the cut from ``position`` to its latest step's end."""
        return torch.cat(self.history[stream], dim=1)[:, position:]

    def finish(self, stream: int, step: int, start: int) -> tuple[int, float]:
        """The token of the stream's latest step, from the rest of the model here, and its seconds."""
        adopt_torch_threads()
        t0 = time.perf_counter()
        latest = self.history[stream][-1]
        if self.cached.get(stream) == start:
            logits = self.stage.forward(stream, latest, start)
        else:
            logits = self.stage.forward(stream, self.since(stream, 0), 0)
        self.cached[stream] = start + latest.shape[1]
        return self.sampling.choose(logits[0], stream, step), time.perf_counter() - t0

    def stage2_served(self, stream: int) -> None:
        """Stage 2 finished the stream's latest step: this tail's cache of it is behind now."""
        self.cached.pop(stream, None)
