"""What a lossy wire costs a split, measured: an evaluation pass after a run's timed batches.

``--eval-samples N`` inputs of the run's data go through the unsplit float32 model and through
the run's split with every cut's tensors sent as the run's wire dtype would send them (cast there
and back, or quantised and dequantised: :func:`paretopipe.partition.wirequant.roundtrip`, the
same code the stages run). The stages of a split compute exactly the unsplit model's segments
(the exactness tests prove it), so what differs is what the wire did. Stage 1 runs the pass after
its last timed batch, on its own stages: nothing of it is in the timings.

The figures, into the record's summary, ``runs.csv`` and ``summary.csv``: ``fidelity_samples``,
``fidelity_top1_agreement`` (the split's top-1 class equals the unsplit model's),
``fidelity_kl_mean`` (the mean KL divergence of the split's softmax from the unsplit model's, in
nats) and, where the data is labelled (an ImageFolder, CIFAR-10), ``accuracy_top1`` beside
``accuracy_top1_float32``, the unsplit float32 model's accuracy on the same samples. The inputs
are drawn apart from the timed batches' (synthetic data under another seed; a folder's first N
images).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import ParetoPipeError, UsageError
from ..llm.build import build_stage
from ..llm.generate import reference_model
from ..llm.stage import LMStage, decode_cut, encode_cut
from ..llm.realtext import ABOUT, real_text
from ..llm.prompts import seeded_prompt
from ..partition import wirequant
from ..partition.activation import Activation, call_stage, live_tensors
from ..partition.stages import StageBuilder, adopt_torch_threads
from .inputs import SampleSet
from ..wiredtype import AUTO, AUTO_ORDER
from .runconfig import RunConfig, eval_samples_for

log = logging.getLogger("paretopipe.fidelity")
#: The synthetic evaluation inputs' seed, apart from every timed batch's (whose seed is the run's).
EVAL_SEED = 1_000_003
#: The calibration inputs' seed of --wire-dtype auto, apart from the evaluation pass's.
CALIBRATION_SEED = EVAL_SEED + 1
#: Samples evaluated at once.
CHUNK = 32


def sample_set(cfg: RunConfig, size: int, seed: int = EVAL_SEED) -> SampleSet:
    """The evaluation's inputs; more than a folder holds is refused in one line."""
    samples = SampleSet(cfg.dataset, size, cfg.eval_samples, cfg.data_dir, seed=seed, model=cfg.model)
    if cfg.eval_samples > len(samples):
        raise UsageError(f"--eval-samples {cfg.eval_samples}: the dataset {cfg.dataset} holds {len(samples)} images")
    return samples


def evaluate(builder: StageBuilder, cfg: RunConfig, seed: int = EVAL_SEED) -> dict[str, Any]:
    """The run's fidelity figures (none for an adaptive run, whose cut changes, or a model whose
    output is not one tensor of class scores)."""
    if cfg.workload.generates:
        return evaluate_generation(builder, cfg, seed) if cfg.eval_samples else {}
    if not cfg.eval_samples or cfg.adaptive:
        return {}
    adopt_torch_threads()
    t0 = time.perf_counter()
    samples = sample_set(cfg, builder.input_size, seed)
    stages = [builder.stage(list(cfg.cuts), i) for i in range(len(cfg.cuts) + 1)]
    agree, kl, right, right_ref, n = 0, 0.0, 0, 0, cfg.eval_samples
    with torch.no_grad():
        for start in range(0, n, CHUNK):
            idx = range(start, min(n, start + CHUNK))
            x = torch.stack([samples.image(i) for i in idx]).to(builder.device)
            ref, got = builder.model(x), _split(stages, x, cfg.wire_dtype)
            if not (isinstance(ref, torch.Tensor) and ref.dim() == 2 and isinstance(got, torch.Tensor)):
                return {}
            ref, got = ref.double().cpu(), got.double().cpu()
            agree += int((ref.argmax(1) == got.argmax(1)).sum())
            logp, logq = ref.log_softmax(1), got.log_softmax(1)
            kl += float((logp.exp() * (logp - logq)).sum())
            if samples.labelled:
                labels = torch.tensor([samples.label(i) for i in idx])
                right += int((got.argmax(1) == labels).sum())
                right_ref += int((ref.argmax(1) == labels).sum())
    out = {"fidelity_samples": n, "fidelity_top1_agreement": agree / n, "fidelity_kl_mean": kl / n,
           "fidelity_eval_s": time.perf_counter() - t0}
    if samples.labelled:
        out.update(accuracy_top1=right / n, accuracy_top1_float32=right_ref / n)
    return out


def text_ids(builder: Any, path: str) -> list[int]:
    """``--eval-text``'s token ids, tokenised as the model's prompts are (an unreadable file in one line)."""
    try:
        return builder.tokenizer.encode(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise UsageError(f"--eval-text {path}: {exc.strerror or exc}")


def evaluation_text(builder: Any, cfg: RunConfig) -> str | None:
    """``--eval-text``; for trained weights without one, real prose (:mod:`paretopipe.llm.realtext`)
    where it is installed; else None (seeded ids: the portable weights have no language)."""
    if cfg.eval_text is not None or builder.src.model_dir is None:
        return cfg.eval_text
    path = real_text()
    if path is not None:
        log.info("perplexity on %s", ABOUT)
    return None if path is None else str(path)


def evaluation_tokens(builder: Any, cfg: RunConfig, seed: int = EVAL_SEED) -> list[int]:
    """A language model's evaluation sequence: ``eval_samples`` + 1 token ids of
    :func:`evaluation_text` (tokenised as the model's prompts are: its first tokens, or its last
    for ``--wire-dtype auto``'s calibration, apart from them where the text is long enough), or
    seeded ids under ``seed``; refused in one line when the text is missing or too short, or the
    model has fewer positions."""
    n, shape = cfg.eval_samples + 1, builder.shape
    if n > shape.max_position_embeddings:
        raise UsageError(f"--eval-samples {cfg.eval_samples}: {builder.name} has {shape.max_position_embeddings} "
                         f"positions; give --eval-samples {shape.max_position_embeddings - 1} or fewer")
    text = evaluation_text(builder, cfg)
    if text is None:
        return seeded_prompt(n, shape.vocab_size, seed)
    ids = text_ids(builder, text)
    if len(ids) < n:
        raise UsageError(f"--eval-text {text}: {len(ids)} tokens; --eval-samples {cfg.eval_samples} "
                         f"needs {n} (give --eval-samples {max(1, len(ids) - 1)} or a longer text)")
    return ids[:n] if seed == EVAL_SEED else ids[-n:]


def evaluate_generation(builder: Any, cfg: RunConfig, seed: int = EVAL_SEED) -> dict[str, Any]:
    """A language model's figures, teacher-forced on :func:`evaluation_tokens`: each position's
    next-token prediction through the split (every cut's hidden state sent as the run's wire dtype
    sends it) against the unsplit float32 model's: top-1 agreement, mean KL, and each one's
    perplexity on the sequence's real next tokens. Stages of their own, so the run's are untouched."""
    adopt_torch_threads()
    t0 = time.perf_counter()
    ids = evaluation_tokens(builder, cfg, seed)
    splits = builder.plan(list(cfg.cuts))
    stages = [LMStage(build_stage(builder.src, splits, i)) for i in range(len(splits) + 1)]
    given = torch.tensor([ids[:-1]])
    x = given
    with torch.inference_mode():
        for i, stage in enumerate(stages):
            if i:
                x = decode_cut(encode_cut(x, cfg.wire_dtype), cfg.wire_dtype)
            x = stage.forward(0, x, 0, all_positions=i == len(stages) - 1)
        got = x[0].double()
        ref = reference_model(builder.src)(input_ids=given).logits[0].double()
    target = torch.tensor(ids[1:])
    logp, logq = ref.log_softmax(-1), got.log_softmax(-1)
    n = len(ids) - 1
    return {"fidelity_samples": n, "fidelity_top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).sum()) / n,
            "fidelity_kl_mean": float((logp.exp() * (logp - logq)).sum()) / n,
            "perplexity": float(torch.exp(-logq[torch.arange(n), target].mean())),
            "perplexity_float32": float(torch.exp(-logp[torch.arange(n), target].mean())),
            "fidelity_eval_s": time.perf_counter() - t0}


def chosen(builder: StageBuilder, cfg: RunConfig) -> RunConfig:
    """``--wire-dtype auto``: the run with the first dtype of :data:`AUTO_ORDER` (the fewest bytes
    first) whose fidelity on a calibration set reaches ``cfg.fidelity_target`` (top-1 agreement; on
    labelled data, accuracy over the unsplit model's), chosen before the timed batches, with the
    evidence in ``wire_choice``. The calibration inputs are drawn apart from the evaluation pass's
    (synthetic data under a seed of their own; a folder's first images, as the pass takes)."""
    if cfg.wire_dtype != AUTO:
        return cfg
    n = cfg.eval_samples or eval_samples_for(None, AUTO)
    tried: dict[str, dict[str, float]] = {}
    pick, measure = "float32", "top-1 agreement"
    for dtype in AUTO_ORDER[:-1]:
        f = evaluate(builder, dataclasses.replace(cfg, wire_dtype=dtype, eval_samples=n), seed=CALIBRATION_SEED)
        if not f:
            break  # an adaptive run or a detector: nothing to calibrate on, so nothing lossy is chosen
        if f.get("accuracy_top1_float32"):  # labelled data: the accuracy it keeps
            kept, measure = f["accuracy_top1"] / f["accuracy_top1_float32"], "accuracy over float32's"
        else:
            kept = f["fidelity_top1_agreement"]
        tried[dtype] = {"kept": kept, "kl_mean": f["fidelity_kl_mean"]}
        if kept >= cfg.fidelity_target:
            pick = dtype
            break
    log.info("--wire-dtype auto at %s: %s (%s >= %s; tried %s)", ",".join(cfg.cuts), pick, measure,
             cfg.fidelity_target, ", ".join(f"{d} {v['kept']:.4f}" for d, v in tried.items()))
    return dataclasses.replace(cfg, wire_dtype=pick, wire_choice={
        "target": cfg.fidelity_target, "measure": measure, "calibration_samples": n, "tried": tried, "chosen": pick})


def figures(builder: StageBuilder, cfg: RunConfig) -> dict[str, Any]:
    """:func:`evaluate`, or why it failed, recorded beside the run's timings (which stay valid)."""
    try:
        return evaluate(builder, cfg)
    except (ParetoPipeError, OSError) as exc:
        log.warning("the fidelity evaluation failed: %s", exc)
        return {"fidelity_error": str(exc)[:300]}


def _split(stages: list[Any], x: torch.Tensor, wire_dtype: str) -> Activation:
    """The split's output, every cut's tensors sent as ``wire_dtype`` sends them."""
    h: Activation = x
    for i, stage in enumerate(stages):
        if i:
            crossed = tuple(wirequant.roundtrip(t, wire_dtype) for t in live_tensors(h))
            h = crossed if isinstance(h, tuple) else crossed[0]
        h = call_stage(stage, h)
    return h
