"""``automated_split_tester.py``/``paretopipe sweep`` for a language model: every split under every
network and prompt length, time to first token and time per token, their fronts."""

from __future__ import annotations

from typing import Sequence

from ..energy.memory import parse_limits
from ..errors import UsageError
from ..runners import flags
from ..runners.lm_sweep import LMSweepOptions
from .lm_stages import add_generation_flags, add_model_flags
from .common import (ArgumentParser, HelpFormatter, add_common_flags, example_epilog, positive_float,
                     positive_int, setup_logging)


def parser(prog: str = "automated_split_tester.py") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Sweep every split of a language model on this machine: stage 1 here, the last "
                                   "stage in a process of its own on the next CPU, under each emulated network and "
                                   "prompt length; writes a session (runs/, summary.csv, report/) and prints the "
                                   "time-to-first-token / time-per-token fronts.",
                       epilog=example_epilog("python automated_split_tester.py --model smollm2-135m --splits all "
                                             "--network lan,wifi,lte --prompt-len 128,1024 --gen-tokens 64",
                                             "python automated_split_tester.py --model tiny-lm --splits all "
                                             "--network lan,3g --gen-tokens 16"))
    g = p.add_argument_group("model and splits")
    add_model_flags(g)
    g.add_argument("--splits", default="all", help="all, 1,4,8 or 2-10 (python -m paretopipe split --model NAME --list)")
    w = p.add_argument_group("workload")
    add_generation_flags(w, sweep=True)
    w.add_argument("--runs", type=positive_int, default=1, help="runs per configuration")
    w.add_argument("--memory-limit", default=None,
                   help="stage1=512MiB or one size per stage (512MiB,4GiB), as the image sweep takes it: a stage that "
                        "would hold more (parameters + KV cache at the full context) makes the configuration "
                        "infeasible: recorded, not run")
    flags.THREADS.add_to(w, default=1)
    n = p.add_argument_group("network conditions (emulated link)")
    n.add_argument("--network", "--networks", dest="network", default="lan",
                   help="comma list of named conditions (lan, wifi, lte, 4g, 3g, ...); unshaped: no emulation")
    n.add_argument("--network-file", default=None, help="a TOML file of named network conditions")
    n.add_argument("--timeout", type=positive_float, default=None, help="seconds without a token before a run is dead")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="results-llm", help="folder of sessions")
    o.add_argument("--session", default=None, help="session folder name (default: a timestamp)")
    add_common_flags(p)
    return p


def _two(values: list[float] | None, flag: str) -> list[float] | None:
    if values is not None and len(values) != 2:
        raise UsageError(f"{flag}: a language-model sweep has two stages: give two values, e.g. 2.7,45")
    return values


def main(argv: Sequence[str] | None, prog: str = "automated_split_tester.py") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.model is None and args.model_dir is None:
        raise UsageError("give --model NAME or --model-dir DIR")
    opts = LMSweepOptions(model=args.model, model_dir=args.model_dir, splits=args.splits, networks=[
        n.strip() for n in args.network.split(",") if n.strip()], prompt_lens=args.prompt_len,
        gen_tokens=args.gen_tokens, streams=args.streams, cut_dtypes=args.cut_dtype, runs=args.runs, out=args.out,
        session=args.session, network_file=args.network_file, seed=args.seed, warmup=args.warmup,
        threads=args.threads, memory_limits=parse_limits(args.memory_limit, 2), timeout_s=args.timeout,
        power_idle_w=_two(args.power_idle_w, "--power-idle-w"), power_core_w=_two(args.power_core_w, "--power-core-w"))
    # lazy for start-up: torch, transformers
    from ..runners.lm_sweep import LMSweep

    session = LMSweep(opts).run()
    # lazy for start-up: matplotlib
    from ..analysis.lm_fronts import report

    print(report(session))
    return 0
