"""The workload's flags, shared by the data sources (``partition1.py``, ``distributed_runner.py``'s
master): a language model's generation (prompts, tokens, streams, sampling), and the one rule
that refuses, in one line, a flag of the other kind of workload."""

from __future__ import annotations

import argparse
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import UsageError
from ..workload import GENERATION, IMAGES, Workload
from ..loadgen import logs as loadgen_logs
from ..options import flags
from ..transport.runconfig import Generation

#: What an image model's batches take and a language model's steps do not (their dests).
IMAGE_ONLY = ("batch_size", "num_batches", "in_flight", "dataset", "data_dir", "enable_prefetch", "prefetch_batches",
              "cut", "num_classes", "weights", "models_dir", "num_test_samples", "use_pipelining")
#: What a generation takes (its dests), refused for an image model.
GENERATION_ONLY = ("prompt", "prompt_len", "gen_tokens", "streams", "temperature", "top_k", "check_exact", "chat")
LANGUAGE_MODELS = "a language model (--model tiny-lm, smollm2-135m, ... or --model-dir DIR)"
#: The flags each workload alone takes (by its name), which the other refuses.
OWN_FLAGS = {IMAGES.name: IMAGE_ONLY, GENERATION.name: GENERATION_ONLY}
#: Whose flag a refused one is, and what the model given is instead, by workload.
_WHOSE = {IMAGES.name: "an image model", GENERATION.name: LANGUAGE_MODELS}
_IS_A = {IMAGES.name: "an image model",
         GENERATION.name: "a language model (its own options are --help's language-model group)"}


def add_generation_flags(parser: argparse.ArgumentParser) -> None:
    """A data source's generation group: what a language model's run generates."""
    g = parser.add_argument_group(f"generation: {LANGUAGE_MODELS}")
    for row in (flags.PROMPT, flags.PROMPT_LEN, flags.GEN_TOKENS, flags.STREAMS, flags.TEMPERATURE, flags.TOP_K):
        row.add_to(g)
    g.add_argument(*flags.CHECK_EXACT.flags, action="store_true", help=flags.CHECK_EXACT.help)
    g.add_argument(*flags.CHAT.flags, action="store_true", help=flags.CHAT.help)


def check_workload_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, kind: Workload,
                         own_flags: Mapping[str, Sequence[str]] = OWN_FLAGS) -> None:
    """Refuse a flag given a value of its own that belongs to another workload than the model's
    (``own_flags``: each workload's own flags, by its name; a command's own table where it has one)."""
    actions = {a.dest: a for a in parser._actions}
    for other, dests in own_flags.items():
        for dest in dests if other != kind.name else ():
            if dest in actions and getattr(args, dest) != _default(actions[dest]):
                raise UsageError(f"{actions[dest].option_strings[0]} applies to {_WHOSE[other]}; "
                                 f"{args.model_dir or args.model} is {_IS_A[kind.name]}")


def _default(action: argparse.Action) -> Any:
    """An option's default as its parsed value would be (argparse types a default given as text,
    as an experiment file's are)."""
    if isinstance(action.default, str) and action.type is not None:
        return action.type(action.default)
    return action.default


def generation_from_args(args: argparse.Namespace) -> Generation:
    """A data source's generation from its flags (warm-up: ``--warmup`` short generations)."""
    return Generation(gen_tokens=args.gen_tokens, streams=args.streams, prompt_len=args.prompt_len,
                      prompt=args.prompt, temperature=args.temperature, top_k=args.top_k,
                      check_exact=args.check_exact, warmup_streams=args.warmup, chat=args.chat)


def save_tokens(path: str, tokens: Sequence[Sequence[int]]) -> None:
    """``--save-outputs`` of a generation: every stream's token ids under ``tokens``."""
    np.savez(path, tokens=np.asarray(tokens, dtype=np.int64))


def generation_line(record: dict[str, Any], text: str) -> str:
    """A generation's figures in words: time to first token and per token, tokens/s, the text (and
    LoadGen's, under a scenario)."""
    s = record["summary"]
    ms = lambda x: "n/a" if x is None else f"{x * 1e3:.2f} ms"  # noqa: E731
    line = (f"ttft {ms(s['ttft_median_s'])}, time per token {ms(s['tpot_median_s'])} (p90 {ms(s['tpot_p90_s'])}), "
            f"{'n/a' if s['tokens_per_s'] is None else format(s['tokens_per_s'], '.1f')} tokens/s, text {text[:60]!r}")
    if s.get("token_agreement") is not None:
        line += (f", against unsplit float32: tokens agree {s['token_agreement']:.0%}, largest logit difference "
                 f"{s['max_logit_diff']:.2g}")
    if s.get("perplexity") is not None:
        line += (f"; teacher-forced on {s['fidelity_samples']} tokens: next token agrees {s['fidelity_top1_agreement']:.1%}, "
                 f"perplexity {s['perplexity']:.4g} (float32 {s['perplexity_float32']:.4g})")
    measured, modelled = s.get("energy_per_token_j"), s.get("energy_modelled_per_token_j")
    if measured is not None or modelled is not None:
        line += f", {(measured if measured is not None else modelled) * 1e3:.1f} mJ a token" + (
            " (modelled)" if measured is None else "")
    return line + (f", {loadgen_line(record)}" if record.get("loadgen") else "")


def loadgen_line(record: dict[str, Any]) -> str:
    """A LoadGen run's figures in words: the scenario's metric, LoadGen's verdict, the settings' standing."""
    s, lg = record["summary"], record["loadgen"]
    accuracy = (f", top-1 {s['loadgen_accuracy_top1']:.4f} over {s['loadgen_accuracy_samples']} samples"
                if s.get("loadgen_accuracy_top1") is not None else "")
    return f"LoadGen {lg['options']['scenario']}: {loadgen_logs.headline(lg['options']['scenario'], s)}{accuracy} [{lg['compliance']}]"
