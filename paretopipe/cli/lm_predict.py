"""``paretopipe profile`` and ``paretopipe predict`` for a language model: each block's compute
per phase on this device, then every split's time to first token and time per token under any
network, and how a sweep's measurements compare."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from .. import cpushare, records
from ..analysis import lm_fronts
from ..errors import UsageError
from ..llm import shapes
from ..predict import lm_costmodel
from ..runners import flags
from .lm_stages import add_model_flags
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_network_flags, example_epilog,
                     positive_int, setup_logging)
from ..network.conditions import get_conditions

log = logging.getLogger("paretopipe.predict")


def profile_parser(prog: str = "python -m paretopipe.profile") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="A language model's device profile: every block's compute in the prefill of a "
                                   "prompt and in a decode step, timed on this device as a stage runs it.",
                       epilog=example_epilog("python -m paretopipe.profile --model tiny-lm --prompt-len 16,128 "
                                             "--threads 1 --out profiles/cpu-tiny-lm.json"))
    add_model_flags(p)
    flags.PROMPT_LENS.add_to(p)
    p.add_argument("--decode-steps", type=positive_int, default=16, help="decode steps timed after each prefill")
    p.add_argument("--repetitions", type=positive_int, default=5, help="timed prefills; the median is kept")
    flags.THREADS.add_to(p)
    flags.CPUS.add_to(p)
    flags.CPU_SHARE.add_to(p)
    p.add_argument("--out", required=True, help="device profile JSON to write")
    add_common_flags(p)
    return p


def profile_main(argv: Sequence[str] | None, prog: str = "python -m paretopipe.profile") -> int:
    args = profile_parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.model is None and args.model_dir is None:
        raise UsageError("give --model NAME or --model-dir DIR")
    # lazy for start-up: torch, transformers
    from ..llm.build import source
    # lazy for start-up: torch
    from ..llm.profile import profile
    # lazy for start-up: torch
    from ..partition.stages import apply_cpu_limits

    if args.cpu_share is not None:
        cpushare.check_share(args.cpu_share)
    limits = apply_cpu_limits(args.cpus, args.threads)
    src = source(None if args.model_dir else args.model, args.model_dir)
    for plen in args.prompt_len:
        if plen + args.decode_steps > src.shape.max_position_embeddings:
            raise UsageError(f"--prompt-len {plen} and {args.decode_steps} decode steps exceed the model's "
                             f"{src.shape.max_position_embeddings} positions")
    with cpushare.limited(args.cpu_share, "profile") as applied:
        data = profile(src, args.prompt_len, args.decode_steps, args.repetitions, args.threads)
    data["limits"] = {**limits, **applied}
    path = records.atomic_write_json(Path(args.out), data)
    for plen, ph in data["prompt_lens"].items():
        print(f"{src.name} prompt {plen}: prefill {sum(ph['prefill_s']) * 1e3:.2f} ms, decode step "
              f"{sum(ph['decode_s']) * 1e3:.2f} ms over {len(data['blocks'])} blocks")
    print(f"written {path}")
    return 0


def predict_parser(prog: str = "python -m paretopipe.predict") -> ArgumentParser:
    p = ArgumentParser(prog=prog, formatter_class=HelpFormatter,
                       description="Every split of a language model, predicted from two device profiles: time to "
                                   "first token and time per token under each network; --validate compares a sweep.",
                       epilog=example_epilog("python -m paretopipe.predict --model tiny-lm --device-profiles "
                                             "profiles/cpu-tiny-lm.json,profiles/cpu-tiny-lm.json --network lan,3g "
                                             "--prompt-len 16"))
    add_model_flags(p)
    p.add_argument("--device-profiles", required=True, help="stage 1's and stage 2's profiles, comma-separated")
    add_network_flags(p, many=True)
    flags.PROMPT_LENS.add_to(p)
    flags.CUT_DTYPE.add_to(p)
    p.add_argument("--validate", default=None, metavar="SESSION",
                   help="a language-model sweep's session (or a folder of them): predicted against measured")
    p.add_argument("--out", default=None, help="write the predictions (and the validation) as JSON here")
    add_common_flags(p)
    return p


def predict_main(argv: Sequence[str] | None, prog: str = "python -m paretopipe.predict") -> int:
    args = predict_parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    if args.model_dir is not None:
        # lazy for start-up: torch, transformers (a folder's config is read through them)
        from ..llm.build import source

        shape = source(None, args.model_dir).shape
    else:
        shape = shapes.named(args.model or "")
    profiles = [lm_costmodel.load_profile(p.strip()) for p in args.device_profiles.split(",") if p.strip()]
    networks = [n.strip() for n in (args.network or "lan").split(",") if n.strip()]
    rows = []
    for name in networks:
        conditions = None if name == "unshaped" else get_conditions(name, args.network_file)
        for plen in args.prompt_len:
            rows += lm_costmodel.predict(shape, profiles, conditions, plen, args.cut_dtype)
    print(lm_costmodel.table(rows))
    result = {"predictions": rows}
    if args.validate:
        session = lm_fronts.find_lm_session(Path(args.validate))
        if session is None:
            raise UsageError(f"--validate {args.validate}: no language-model session there")
        check = lm_costmodel.validate(rows, session / "summary.csv")
        result["validation"] = check
        print(f"validation against {session}: {check['configurations']} configurations, median |error| time to "
              f"first token {check['ttft_median_abs_error']:.1%}, time per token {check['tpot_median_abs_error']:.1%}")
    if args.out:
        records.atomic_write_json(Path(args.out), result)
    return 0

