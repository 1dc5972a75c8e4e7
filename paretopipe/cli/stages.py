"""Command-line faces of the TCP backend: ``partition1.py`` (stage 1) and ``partition2.py`` (stage 2)."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any, Sequence

from .. import engines
from ..compute import cputrace
from ..errors import UsageError
from ..splitspec import check_splits, parse_splits, Split, split_cuts
from ..transport import aead, auth
from ..options import flags
from ..splitspec import POLICIES
from ..transport.runconfig import AdaptiveOptions, DEFAULT_MAX_PAYLOAD, Generation, RunConfig, eval_samples_for
from ..llm.shapes import workload_of
from .workload_flags import (add_generation_flags, check_workload_flags, generation_from_args, generation_line,
                             loadgen_line, save_tokens)
from .common import (ArgumentParser, HelpFormatter, add_common_flags, add_dataset_flags, add_loadgen_flags,
                     add_network_flags, add_prefetch_flags, dataset_from_args, loadgen_from_args, example_epilog, fmt_ms, fmt_num, network_from_args,
                     nonneg_int, port_number, positive_float, positive_int, run_config_from_flags, save_outputs,
                     setup_logging, signals_as_interrupt, stage_secret, transport_spec)
from ..network import deadlines, tc

if TYPE_CHECKING:  # torch is imported where a stage runs, not for --help or a refused flag
    from ..partition.stages import StageBuilder

log = logging.getLogger("paretopipe.tcp")
DEFAULT_PORT = 5555


def _common(parser: argparse.ArgumentParser, stage: int) -> None:
    g = parser.add_argument_group("model and split (both stages must agree)")
    flags.MODEL.add_to(g, default="mobilenetv2", aliases=("--model-name",))
    flags.SPLIT.add_to(g, aliases=("--split-index",), dest="split_index", type=split_or_adaptive,
                       help="block index k: the first k blocks run on stage 1 (0 and K are the baselines); "
                        "k1,k2,...: a chain of stages (stage 1 runs blocks up to k1, stage 2 up to k2, ...); "
                        "adaptive: choose per batch from the measured link (both stages hold every block)"
                        + ("" if stage == 1 else "; omitted: whatever stage 1 runs"))
    flags.CUT.add_to(g, help="a fine fx cut name instead of --split (paretopipe split --list --fine)")
    for row in (flags.NUM_CLASSES, flags.WEIGHTS, flags.MODELS_DIR, flags.MODEL_DIR):
        row.add_to(g)
    n = parser.add_argument_group("connection")
    flags.PORT.add_to(n, default=DEFAULT_PORT, help="stage 1's data port")
    flags.TIMEOUT.add_to(n, help="seconds without progress before the run is declared dead (default: 60 s plus what the "
                        "batches in flight need on the link: bytes at its slowest rate, delay, jitter, losses"
                        + ("" if stage == 1 else "; stage 1's deadline") + ")")
    n.add_argument("--connect-timeout", type=positive_float, default=60.0, help="seconds to wait for the peer to appear")
    n.add_argument("--max-payload", type=positive_int, default=DEFAULT_MAX_PAYLOAD, help="largest frame payload accepted, bytes")
    flags.ENV_FILE.add_to(n, help=f"where {auth.SECRET_ENV} (the data port's shared secret) and the MQTT broker's "
                                  f"settings are read from")
    flags.TRANSPORT.add_to(n)
    flags.MQTT_QOS.add_to(n)
    flags.ENCRYPT.add_to(n, help=flags.ENCRYPT.help + ". Both stages must agree")
    r = parser.add_argument_group("execution and output")
    flags.DEVICE.add_to(r)
    flags.THREADS.add_to(r)
    flags.OUT.add_to(r, aliases=("--output-dir",), default=None if stage == 1 else ".", help="folder for the run JSON")
    r.add_argument("--link-dev", default=None, help="with --link tc: interface whose qdiscs are read back into the manifest")
    add_common_flags(parser)


def _link_timeout_s(args: argparse.Namespace, builder: StageBuilder, cuts: list[str] | None, conditions,
                    generation: Generation | None) -> float:
    """The run's deadline from the bytes its batches send under ``conditions`` (none: the base): a
    batch of images, or every stream's prefill at once."""
    part = builder.partitioner
    names = part.block_cuts() if args.split_index in POLICIES or not cuts else cuts
    if generation is not None:
        items = max(len(p) for p in builder.prompts(generation, args.seed))
        up = max(part.payload_nbytes(c, items) for c in names)
        return deadlines.run_timeout_s(conditions, up, 64, generation.streams)
    itemsize = 2 if args.wire_dtype in ("float16", "bfloat16") else 4
    up = max(part.payload_nbytes(c, args.batch_size) for c in names) * itemsize // 4
    return deadlines.run_timeout_s(conditions, up, args.num_classes * 4 * args.batch_size, args.in_flight)


def split_or_adaptive(text: str) -> int | list[int] | str:
    """``--split``: a block index k, a plan of N stages as a comma list (``3,9``), or a policy
    (``adaptive``, ``sciot``)."""
    if text.strip().lower() in POLICIES:
        return text.strip().lower()
    if "," in text:
        try:
            return Split.of([nonneg_int(k) for k in text.split(",")]).config
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    return nonneg_int(text)


def _builder(args: argparse.Namespace, required: bool = True) -> tuple[StageBuilder, list[str] | None]:
    import torch

    # lazy for start-up: torch, transformers
    from ..transport.stagemodel import stage_builder

    if args.threads:
        torch.set_num_threads(args.threads)
    builder = stage_builder(args.model, num_classes=args.num_classes, weights=args.weights, models_dir=args.models_dir,
                            device=args.device, model_dir=args.model_dir)
    if args.split_index in POLICIES:
        if args.cut is not None:
            raise UsageError(f"--cut and --split {args.split_index} exclude each other: give one of them (the adaptive runtime "
                             "picks its splits itself; --candidates names cuts for it)")
        # Stage 2 insists on nothing; stage 1 starts at K (all local) until its first choice.
        return builder, (None if not required else [builder.partitioner.block_cut(builder.partitioner.num_blocks)])
    if args.split_index is None and args.cut is None:
        if not required:
            return builder, None
        raise UsageError(f"give --split (0..{builder.partitioner.num_blocks} for {builder.name}) or --cut NAME")
    if isinstance(args.split_index, list):  # a chain of len + 1 stages
        if args.cut is not None:
            raise UsageError("--cut and a plan of several splits exclude each other: give one of them")
        check_splits(args.split_index, builder.partitioner.num_blocks, builder.name)
        return builder, [builder.partitioner.block_cut(k) for k in args.split_index]
    return builder, builder.cuts_for(args.split_index, args.cut)


def _observed_link(args: argparse.Namespace) -> dict | None:
    if getattr(args, "link", None) != "tc":
        return None
    if not args.link_dev:
        raise UsageError("--link tc needs --link-dev IFACE so the applied qdiscs can be read back")
    return tc.observed_link_state(args.link_dev)


def stage1_parser(prog: str = "partition1.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Stage 1 of a TCP pipeline: the data source. Listens, runs the first "
                    "part of the model, sends activations to stage 2, receives results and measures "
                    "end-to-end latency on its own monotonic clock. --split k1,k2 makes a chain of three "
                    "(stage 2 is then a middle stage started with --next-port).",
        epilog=example_epilog(
            "python partition1.py --model mobilenetv2 --split 8",
            "python partition1.py --model resnet50 --split 4 --in-flight 4 --network lte",
            "python partition1.py --model vgg16 --cut features_16 --compression zstd --wire-dtype float16"))
    flags.HOST.add_to(p, default="0.0.0.0", help="address to listen on")
    _common(p, 1)
    d = p.add_argument_group("workload")
    flags.BATCH_SIZE.add_to(d)
    flags.NUM_BATCHES.add_to(d, type=nonneg_int)
    flags.WARMUP.add_to(d)
    flags.IN_FLIGHT.add_to(d)
    flags.MAX_BATCH_S.add_to(d)
    add_dataset_flags(d, default="auto")
    add_prefetch_flags(d)
    flags.SEED.add_to(d)
    flags.COMPRESSION.add_to(d)
    d.add_argument("--compression-level", type=positive_int, default=3)
    flags.WIRE_DTYPE.add_to(d)
    flags.ENGINE.add_to(d, help=flags.ENGINE.help + " (stage 1 tells every stage)")
    flags.STAGE_ENGINES.add_to(d)
    flags.EVAL_SAMPLES.add_to(d)
    flags.EVAL_TEXT.add_to(d)
    flags.FIDELITY_TARGET.add_to(d)
    k = p.add_argument_group("network conditions")
    add_network_flags(k)
    flags.LINK.add_to(k, help="emulated: in-process link for --network (the choice when one is given); tc: shaped by "
                              "network_delay.py")
    k.add_argument("--network-delay-ms", type=float, default=None, help="anchor label only; the manifest records the link actually used")
    flags.STAGE_CPU_TRACE.add_to(k, help="stage1=FILE: this stage's CPU share follows a compute trace (CSV "
                                         "time_s,cpu_share, or pi4-throttle, noisy-neighbour) through a cgroup quota, "
                                         "from the batches' start at a seeded offset")
    a = p.add_argument_group("adaptive split (--split adaptive)")
    flags.OBJECTIVE.add_to(a)
    flags.DEADLINE_MS.add_to(a, help=flags.DEADLINE_MS.help + " (adaptive default: only when stage 2 is gone). Also for a static split with --in-flight 1, "
                        "which then serves locally while stage 2 is gone and takes it back when it reconnects")
    a.add_argument("--candidates", default=None,
                   help="splits the chooser may use: all block splits (default), 1,4,8 or 2-10, and cuts of several "
                        "tensors by name (python -m paretopipe.split --list --fine)")
    flags.DEVICE_PROFILES.add_to(a, help="stage 1's and stage 2's profiles (paretopipe profile), comma-separated; default: both "
                        "stages profile themselves briefly at start")
    for row in flags.POLICY_FLAGS:
        row.add_to(a)
    e = p.add_argument_group("modelled energy (a host without power sensors)")
    flags.POWER_IDLE_W.add_to(e)
    flags.POWER_CORE_W.add_to(e)
    add_generation_flags(p)
    add_loadgen_flags(p)
    flags.SAVE_OUTPUTS.add_to(p)
    return p


def adaptive_fields(args: argparse.Namespace, num_blocks: int) -> dict:
    """The RunConfig fields of the adaptive flags (refused without --split adaptive, except the
    deadline, which any run with one batch in flight may have: stage 1 then finishes a late batch)."""
    deadline = {"deadline_s": args.deadline_ms / 1e3 if args.deadline_ms else None}
    given = [f for f, v in (("--candidates", args.candidates), ("--device-profiles", args.device_profiles))
             if v is not None]
    given += [f"--{n.replace('_', '-')}" for n in POLICY_SETTINGS if getattr(args, n) is not None]
    if args.split_index not in POLICIES:
        if given or args.objective != "latency":
            raise UsageError(f"{(given or ['--objective'])[0]} applies to --split adaptive or sciot only")
        return deadline
    settings = {POLICY_SETTINGS[n]: getattr(args, n) for n in POLICY_SETTINGS if getattr(args, n) is not None}
    return {**deadline, "adaptive_split": AdaptiveOptions(
        objective=args.objective, candidates=_candidates(args.candidates, num_blocks) if args.candidates else None,
        device_profiles=args.device_profiles.split(",") if args.device_profiles else None, **settings)}


#: The policies' variance settings: flag dest -> AdaptiveOptions field (unset flags keep SCIoT's defaults).
POLICY_SETTINGS = {"ema_alpha": "ema_alpha", "cv_threshold": "cv_threshold", "variance_window": "window",
                   "local_probability": "local_probability"}


def _candidates(text: str, num_blocks: int) -> list[int | str]:
    """``--candidates``: block splits as ``--splits`` writes them, and cuts of several tensors by name."""
    blocks, named = split_cuts(text)
    return [*(parse_splits(blocks, num_blocks) if blocks.strip(" ,") else []), *named]


def main_stage1(argv: Sequence[str] | None = None, prog: str = "partition1.py") -> int:
    parser = stage1_parser(prog)
    args = parser.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    signals_as_interrupt()
    secret = stage_secret(args)
    aead.check_choice(args.encrypt, secret)
    check_workload_flags(parser, args, workload_of(args.model, args.model_dir))
    traced = cputrace.parse_stage_traces(args.stage_cpu_trace, stages=("stage1",))
    loadgen = loadgen_from_args(args)  # refused before the model is built
    builder, cuts = _builder(args)
    conditions = network_from_args(args)
    cfg = _stage1_config(args, builder, cuts, conditions, loadgen)
    if cfg.eval_samples:  # refused before anything listens, not after the timed batches
        from ..transport.fidelity import evaluation_tokens, sample_set  # lazy for start-up: torch

        evaluation_tokens(builder, cfg) if cfg.workload.generates else sample_set(cfg, builder.input_size)
    observed = _observed_link(args)
    policy = None
    if cfg.adaptive:  # its candidates are checked before anything listens
        # lazy for start-up: torch
        from ..controller.adaptive_setup import adaptive_policy

        policy = adaptive_policy(builder, cfg)
    # lazy for start-up: torch
    from ..transport import messaging, tcp

    spec = transport_spec(args)
    listener = tcp.StageListener(messaging.listen(spec, args.host, args.port, args.max_payload), tcp.identity_of(builder),
                                 secret, args.max_payload, encrypt=args.encrypt)
    log.info("stage 1 listening on %s:%d (%s, cuts %s)", args.host, listener.port, builder.name, cuts)
    try:
        with cputrace.own_group("stage1", traced.get("stage1")) as specs:
            outcome = tcp.run_stage1(listener, builder, cfg, policy=policy, conditions=conditions,
                                     connect_timeout=args.connect_timeout, output_dir=args.out,
                                     keep_outputs=bool(args.save_outputs), observed_link=observed, threads=args.threads,
                                     cpu_traces=specs)
    finally:
        listener.close()
    print(_stage1_line(args, builder, cfg, cuts, outcome))
    return 0


def _stage1_config(args: argparse.Namespace, builder: StageBuilder, cuts: list[str], conditions: Any,
                   loadgen: Any) -> RunConfig:
    """Stage 1's run configuration from its flags: image batches, or a language model's generation."""
    kind = workload_of(args.model, args.model_dir)
    generation = generation_from_args(args) if kind.generates else None
    return run_config_from_flags(args, builder.name, cuts, args.split_index, conditions,
                                 args.timeout or _link_timeout_s(args, builder, cuts, conditions, generation),
                                 num_batches=args.num_batches, in_flight=args.in_flight,
                                 dataset=kind.dataset or dataset_from_args(args, args.compression),
                                 wire_dtype=args.wire_dtype, compression=args.compression,
                                 eval_samples=eval_samples_for(args.eval_samples, args.wire_dtype),
                                 eval_text=args.eval_text,
                                 fidelity_target=args.fidelity_target,
                                 compression_level=args.compression_level, seed=args.seed,
                                 link_mode=args.link or ("emulated" if conditions else "none"),
                                 network_delay_ms_label=args.network_delay_ms, max_batch_s=args.max_batch_s,
                                 loadgen=loadgen, generation=generation,
                                 engine=engines.stage_engines_label(args.stage_engines, len(cuts) + 1)
                                 if args.stage_engines else args.engine,
                                 **_declared_powers(args, len(cuts) + 1),
                                 **adaptive_fields(args, builder.partitioner.num_blocks))


def _declared_powers(args: argparse.Namespace, stages: int) -> dict[str, Any]:
    """Each stage's declared idle and busy-core watts (one value per stage), for the modelled energy."""
    out = {}
    for flag, name in (("--power-idle-w", "power_idle_w"), ("--power-core-w", "power_core_w")):
        values = getattr(args, name)
        if values is not None and len(values) != stages:
            raise UsageError(f"{flag}: give one value per stage ({stages}), got {len(values)}")
        out[name] = values
    return out


def _stage1_line(args: argparse.Namespace, builder: StageBuilder, cfg: RunConfig, cuts: list[str],
                 outcome: Any) -> str:
    """The run in one line (after ``--save-outputs`` is written): a generation's token figures and
    text, or the batches' latency and throughput, an adaptive run's choices and LoadGen's verdict."""
    record, s = outcome.record, outcome.record["summary"]
    written = f", written {outcome.path}" if outcome.path else ""
    if cfg.workload.generates:
        tokens = record["generation"]["tokens"]
        if args.save_outputs:
            save_tokens(args.save_outputs, tokens)
        return (f"{builder.name} split={Split.of(cfg.split_index).label} "
                + generation_line(record, builder.tokenizer.decode(tokens[0])) + _cipher_note(record) + written)
    if args.save_outputs:
        save_outputs(args.save_outputs, outcome.outputs)
    extra = ""
    if cfg.adaptive:
        a = record["manifest"]["stages"][0]["adaptive"]
        # A batch names its split by block index, or a cut of several tensors by its candidate's place.
        used = dict.fromkeys(str(b["split_k"] if b["split_candidate"] is None else a["candidates"][b["split_candidate"]])
                             for b in record["batches"] if not b["warmup"])
        extra = (f", adaptive: splits used {', '.join(used)}, {a['switches']} switches, "
                 f"{a['served_locally']} batches served locally")
        cuts = "adaptive"
    if cfg.loadgen is not None:
        extra += ", " + loadgen_line(record)
    return (f"{builder.name} cuts={cuts} latency median {fmt_ms(s['latency_median_s'])} p95 {fmt_ms(s['latency_p95_s'])}, "
            f"throughput {fmt_num(s['throughput_imgs_per_s'])} img/s, payload {fmt_num(s['payload_bytes_mean'])} B"
            + extra + _cipher_note(record) + written)


def stage2_parser(prog: str = "partition2.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="A later stage of a TCP pipeline: connects to the stage before (stage 1 in a pair), runs "
                    "its part of the model, and returns every result (or, with --next-port, sends its part on "
                    "to the next stage and relays the results back); writes the run JSON into --out. The "
                    "workload (batch size, batches, wire dtype, the plan) comes from stage 1.",
        epilog=example_epilog("python partition2.py --model mobilenetv2 --split 8 --host 192.168.1.10",
                              "python partition2.py --model resnet50 --host 127.0.0.1 --device cuda",
                              "python partition2.py --model mobilenetv2 --host 192.168.1.10 --next-port 5556   "
                              "# the middle of three (stage 1: --split 3,9)",
                              "python partition2.py --model mobilenetv2 --host 192.168.1.11 --port 5556   "
                              "# the last of three"))
    flags.HOST.add_to(p, default="127.0.0.1", help="the previous stage's address (stage 1's in a pair)")
    _common(p, 2)
    c = p.add_argument_group("a chain of more than two stages (stage 1 runs --split k1,k2,...)")
    c.add_argument("--next-port", type=port_number, default=None,
                   help="make this a middle stage: listen on this port for the next stage, send it this stage's "
                        "output, and relay its results back")
    c.add_argument("--next-host", default="0.0.0.0", help="address to listen on for the next stage")
    flags.BATCH_SIZE.add_to(p, default=None, help="accepted for the anchor; stage 1 decides")
    flags.LINK.add_to(p, help=argparse.SUPPRESS)
    return p


def main_stage2(argv: Sequence[str] | None = None, prog: str = "partition2.py") -> int:
    args = stage2_parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    signals_as_interrupt()
    secret = stage_secret(args)
    aead.check_choice(args.encrypt, secret)
    builder, cuts = _builder(args, required=False)
    observed = _observed_link(args)
    # lazy for start-up: torch
    from ..transport import messaging, tcp

    spec = transport_spec(args)
    downstream = None
    if args.next_port is not None:  # listening first, so the next stage may start before this one connects
        downstream = tcp.Downstream(tcp.StageListener(messaging.listen(spec, args.next_host, args.next_port,
                                                                       args.max_payload),
                                                      tcp.identity_of(builder), secret, args.max_payload,
                                                      encrypt=args.encrypt), args.connect_timeout)
    try:
        sock = messaging.connect(spec, args.host, args.port, args.connect_timeout, args.max_payload)
        connection = tcp.open_connection(sock, builder, cuts=cuts, secret=secret, max_payload=args.max_payload,
                                         encrypt=args.encrypt)
        outcomes = tcp.serve_connection(connection, builder, output_dir=args.out, observed_link=observed,
                                        threads=args.threads, timeout_s=args.timeout, downstream=downstream)
    finally:
        if downstream is not None:
            downstream.listener.close()
    for outcome in outcomes:
        role = outcome.record["timing"]["written_by"].replace("stage", "stage ")
        print(f"{role} done: {outcome.record['summary']['batches_measured']} measured batches, written {outcome.path}")
    return 0


def _cipher_note(record: dict) -> str:
    cipher = record["manifest"]["stages"][0].get("cipher") or {}
    if cipher.get("cipher", "none") == "none":
        return ""
    s = record["summary"]
    return (f", sealed with {cipher['cipher']} (seal {fmt_ms(s.get('stage1_seal_median_s'))}, "
            f"open {fmt_ms(s.get('stage2_open_median_s'))} a batch)")
