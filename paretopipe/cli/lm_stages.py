"""``partition1.py``/``partition2.py`` for a language model (``--model smollm2-135m`` or
``--model-dir DIR``): a prefill, then one token at a time, across two stages or a chain."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Sequence

import numpy as np

from ..errors import UsageError
from ..llm import shapes
from ..llm.tokens import prompt_ids, tokenizer_for
from ..runners import flags
from ..transport import aead
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog,
                     fmt_ms, fmt_num, network_from_args, nonneg_int, port_number, positive_float, setup_logging,
                     signals_as_interrupt, stage_secret)

log = logging.getLogger("paretopipe.tcp")
DEFAULT_PORT = 5555


def wants_lm(argv: Sequence[str]) -> bool:
    """Whether a stage's command line names a language model (a named shape or --model-dir)."""
    probe = argparse.ArgumentParser(add_help=False)
    flags.MODEL.add_to(probe, aliases=("--model-name",))
    flags.MODEL_DIR.add_to(probe)
    known, _ = probe.parse_known_args(list(argv))
    return known.model_dir is not None or shapes.is_named(known.model)


def _splits(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a split index k, or k1,k2,... for a chain")


def add_model_flags(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--model (a named shape) or --model-dir (a local folder): every language-model command."""
    flags.MODEL.add_to(group, default=None, aliases=("--model-name",), help=f"a named LM shape: {', '.join(shapes.NAMED)}")
    flags.MODEL_DIR.add_to(group)


def add_generation_flags(group: argparse._ArgumentGroup, sweep: bool = False) -> None:
    """What a run generates; a sweep takes prompt lengths and cut dtypes as lists."""
    if not sweep:
        flags.PROMPT.add_to(group)
    (flags.PROMPT_LENS if sweep else flags.PROMPT_LEN).add_to(group)
    flags.GEN_TOKENS.add_to(group)
    flags.STREAMS.add_to(group)
    (flags.CUT_DTYPES_LIST if sweep else flags.CUT_DTYPE).add_to(group)
    group.add_argument("--seed", type=nonneg_int, default=0)
    group.add_argument("--warmup", type=nonneg_int, default=1, help="short unmeasured generations first")
    flags.POWER_IDLE_W.add_to(group)
    flags.POWER_CORE_W.add_to(group)


def _common(p: argparse.ArgumentParser, stage: int) -> None:
    g = p.add_argument_group("model and split")
    add_model_flags(g)
    g.add_argument("--split", "--split-index", dest="split", type=_splits, default=None,
                   help="k: stage 1 runs the first k blocks (embedding, layers, final norm; 0 sends token ids); "
                        "k1,k2: a chain (python -m paretopipe split --model NAME --list)"
                        + ("" if stage == 1 else "; omitted: whatever stage 1 runs"))
    n = p.add_argument_group("connection")
    n.add_argument("--port", type=port_number, default=DEFAULT_PORT)
    n.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds without a result before the run is declared dead (default 60 plus the link's share)")
    n.add_argument("--connect-timeout", type=positive_float, default=60.0, help="seconds to wait for the peer")
    flags.ENV_FILE.add_to(n)
    n.add_argument("--encrypt", default="none", choices=list(aead.CHOICES), help="seal every frame (AEAD)")
    r = p.add_argument_group("execution and output")
    flags.THREADS.add_to(r)
    r.add_argument("--out", "--output-dir", dest="out", default=None, help="folder for the run JSON")
    add_common_flags(p)


def stage1_parser(prog: str = "partition1.py") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Stage 1 of a split language model: holds the prompts and the first blocks, "
                                   "listens, sends each step's hidden state on and receives the chosen token; "
                                   "time to first token and time per output token on its own clock.",
                       epilog=example_epilog("python partition1.py --model tiny-lm --split 3 --gen-tokens 16",
                                             "python partition1.py --model smollm2-135m --split 16 --prompt-len 128 "
                                             "--network wifi --streams 2"))
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    _common(p, 1)
    w = p.add_argument_group("generation")
    add_generation_flags(w)
    w.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else seeded sampling at this temperature")
    w.add_argument("--top-k", type=nonneg_int, default=0, help="with --temperature: sample among the k largest (0: all)")
    w.add_argument("--check-exact", action="store_true",
                   help="the last stage compares its logits with the unsplit float32 model's after the run (always "
                        "for a lossy --cut-dtype); it then builds the whole model once")
    w.add_argument("--save-outputs", default=None, help="write the generated token ids to this .npz (key: tokens)")
    k = p.add_argument_group("network conditions (emulated link)")
    add_network_flags(k)
    return p


def stage2_parser(prog: str = "partition2.py") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="A later stage of a split language model: connects to the stage before, runs its "
                                   "layers with a KV cache of its own, and (the last stage) chooses each token.",
                       epilog=example_epilog("python partition2.py --model tiny-lm --host 127.0.0.1",
                                             "python partition2.py --model tiny-lm --host 127.0.0.1 --next-port 5556"))
    p.add_argument("--host", default="127.0.0.1", help="the previous stage's address")
    _common(p, 2)
    c = p.add_argument_group("a chain of more than two stages")
    c.add_argument("--next-port", type=port_number, default=None, help="make this a middle stage listening here")
    c.add_argument("--next-host", default="0.0.0.0", help="address to listen on for the next stage")
    return p


def load_source(args: argparse.Namespace):
    """The model a command names (after --threads is applied): a named shape or a folder."""
    import torch  # lazy for start-up: torch

    # lazy for start-up: torch, transformers
    from ..llm.build import source

    if args.threads:
        torch.set_num_threads(args.threads)
    return source(None if args.model_dir else args.model, args.model_dir)


def _begin(args: argparse.Namespace) -> bytes | None:
    """A stage's start: logging, signals as Ctrl-C (so the record is written), the data port's secret."""
    setup_logging(args.debug, args.quiet)
    signals_as_interrupt()
    secret = stage_secret(args)
    aead.check_choice(args.encrypt, secret)
    return secret


def main_lm_stage1(argv: Sequence[str] | None, prog: str = "partition1.py") -> int:
    args = stage1_parser(prog).parse_args(argv)
    secret = _begin(args)
    if args.split is None:
        raise UsageError("give --split K (python -m paretopipe split --model NAME --list shows the cuts)")
    src = load_source(args)
    shapes.check_plan(src.shape, args.split)
    conditions = network_from_args(args)
    # lazy for start-up: torch
    from ..transport import tcp
    # lazy for start-up: torch
    from ..transport.tcp.lm import LMIdentity, run_lm_stage1
    # lazy for start-up: torch
    from ..transport.lmrun import LMRunConfig, run_timeout_s

    tok = tokenizer_for(args.model_dir)
    prompts = [prompt_ids(args.prompt, args.prompt_len, src.shape.vocab_size, src.shape.max_position_embeddings,
                          args.gen_tokens, tok, args.seed, s) for s in range(args.streams)]
    timeout = args.timeout or run_timeout_s(src.shape, conditions, max(len(p) for p in prompts), min(args.split),
                                            args.cut_dtype, args.streams)
    cfg = LMRunConfig(model=src.name, identity=src.identity(), splits=list(args.split), gen_tokens=args.gen_tokens,
                      streams=args.streams, prompt_tokens=[len(p) for p in prompts], cut_dtype=args.cut_dtype,
                      check_exact=args.check_exact or args.cut_dtype != "float32",
                      power_idle_w=per_stage(args.power_idle_w, "--power-idle-w", len(args.split) + 1),
                      power_core_w=per_stage(args.power_core_w, "--power-core-w", len(args.split) + 1),
                      temperature=args.temperature, top_k=args.top_k, seed=args.seed, warmup=args.warmup,
                      timeout_s=timeout, network=conditions.name if conditions else None)
    listener = tcp.StageListener(tcp.listen(args.host, args.port), LMIdentity.of(src).as_dict(), secret,
                                 encrypt=args.encrypt)
    log.info("stage 1 listening on %s:%d (%s, split %s)", args.host, listener.port, src.name, args.split)
    try:
        outcome = run_lm_stage1(listener, src, cfg, prompts, conditions=conditions,
                                connect_timeout=args.connect_timeout, output_dir=args.out, threads=args.threads)
    finally:
        listener.close()
    if args.save_outputs:
        np.savez(args.save_outputs, tokens=np.asarray(outcome.tokens, dtype=np.int64))
    s = outcome.record["summary"]
    print(f"{src.name} split={','.join(map(str, args.split))} ttft {fmt_ms(s['ttft_median_s'])}, time per token "
          f"{fmt_ms(s['tpot_median_s'])} (p90 {fmt_ms(s['tpot_p90_s'])}), {fmt_num(s['tokens_per_s'])} tokens/s, "
          f"text {tok.decode(outcome.tokens[0])[:60]!r}" + _exact_note(s) + _energy_note(s) + (f", written {outcome.path}" if outcome.path else ""))
    return 0


def main_lm_stage2(argv: Sequence[str] | None, prog: str = "partition2.py") -> int:
    args = stage2_parser(prog).parse_args(argv)
    secret = _begin(args)
    src = load_source(args)
    if args.split is not None:
        shapes.check_plan(src.shape, args.split)
    # lazy for start-up: torch
    from ..transport import tcp
    # lazy for start-up: torch
    from ..transport.tcp.lm import LMIdentity, serve_lm_connection

    identity = LMIdentity.of(src)
    downstream = None
    if args.next_port is not None:
        downstream = tcp.Downstream(tcp.StageListener(tcp.listen(args.next_host, args.next_port), identity.as_dict(),
                                                      secret, encrypt=args.encrypt), args.connect_timeout)
    started = time.monotonic()
    try:
        sock = tcp.connect_with_retry(args.host, args.port, args.connect_timeout)
        connection = tcp.open_connection(sock, identity, cuts=None, secret=secret, encrypt=args.encrypt)
        parts = serve_lm_connection(connection, src, threads=args.threads, timeout_s=args.timeout,
                                    downstream=downstream)
    finally:
        if downstream is not None:
            downstream.listener.close()
    for part in parts:
        print(f"stage {part['stage']} done: layers {part['layers'][0]}..{part['layers'][1] - 1}, KV cache "
              f"{part['kv_bytes']} B, peak RSS {part['peak_rss_bytes'] / 2**20:.0f} MiB "
              f"({time.monotonic() - started:.1f}s)")
    return 0


def per_stage(values: list[float] | None, flag: str, stages: int) -> list[float] | None:
    if values is not None and len(values) != stages:
        raise UsageError(f"{flag}: give one value per stage ({stages}), got {len(values)}")
    return values


def _energy_note(summary: dict) -> str:
    j = summary.get("energy_per_token_modelled_j")
    return "" if j is None else f", {j * 1e3:.1f} mJ a token (modelled)"


def _exact_note(summary: dict) -> str:
    if summary.get("token_agreement") is None:
        return ""
    return (f", against unsplit float32: tokens agree {summary['token_agreement']:.0%}, largest logit difference "
            f"{summary['max_logit_diff']:.2g}")
