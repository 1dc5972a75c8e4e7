"""The sweep's options from its parsed flags: the models checked, the testbed from ``.env`` or an
experiment file, the per-stage lists, the ciphers and transports refused where they cannot apply,
and what ``--config``, ``--rerun`` or ``--resume`` contributes. ``paretopipe search`` reads its
space's options the same way."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import engines
from ..compute import cpushare, cputrace
from ..errors import UsageError
from ..controller.hosts import Testbed
from ..controller.processes import check_stage_devices
from ..analysis.session import sweep_session_dir
from ..controller.sweep import SweepOptions
from ..controller.sweep.options import FAULT_DEADLINE_S
from ..analysis.keys import NO_FAULT
from ..faults import parse_faults
from ..controller.sweep.placements import parse_placements
from ..splitspec import parse_plans
from ..network import traces
from ..transport import aead, messaging
from ..transport.auth import load_secret
from . import experiment
from .common import ArgumentParser, dataset_from_args, loadgen_sweep_settings, prefetch_from_args, read_env
from .sweep_flags import simple_fields
from ..energy.memory import parse_limits
from ..llm.families import family_of
from ..llm.shapes import shape_of, workload_of


def _per_stage_ints(text: str | None, flag: str) -> list[int | None]:
    if not text:
        return [None, None]
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) < 2 or min(values) < 1:
        raise UsageError(f"{flag} {text!r}: give one positive integer per stage, e.g. 1,2")
    return values


def _models(args: argparse.Namespace) -> list[str]:
    """The sweep's models, each name checked here, before any host is asked to build it (a
    ``--model-dir`` folder's model is named by its config.json's folder)."""
    if args.model_dir is not None:
        return [shape_of(None, args.model_dir).name]
    models = [m.strip() for m in (args.models or args.model or "mobilenetv2").split(",") if m.strip()]
    if not models:
        raise UsageError("--models names no model")
    for model in models:
        family_of(model).check_name(model)
    return models


def options_from_args(args: argparse.Namespace, exp: experiment.Experiment | None = None) -> SweepOptions:
    models = _models(args)
    kind = workload_of(models[0], args.model_dir)
    devices = [d.strip() for d in args.stage_devices.split(",")] if args.stage_devices else []
    env = read_env(args.env_file)
    if args.local:
        testbed = Testbed()
    elif exp is not None and exp.hosts:
        testbed = Testbed.from_table(exp.hosts, env, devices or None)
    else:
        testbed = Testbed.from_env(env, devices or None)
    if args.hosts_required and not testbed.remote:
        raise UsageError(f"set PI1_IP and PI2_IP (or GPU_IP), or HOSTS, in {args.env_file} or the environment "
                         f"(see .env.example)")
    if args.local:
        testbed.secret = env.get("PARETOPIPE_SECRET") or None
        load_secret(testbed.secret or "")
    if args.iface:
        testbed.iface = args.iface
        for h in testbed.hosts:
            h.iface = args.iface
    if not testbed.remote and any(d.startswith("cuda") for d in devices):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--stage-devices {args.stage_devices}: CUDA is not available on this machine; "
                             f"valid here: cpu")
    plans = parse_plans(args.split_blocks, mixed=bool(args.placements)) if args.split_blocks else None
    stages = max(len(p) + 1 for p in plans) if plans else 2
    placements = parse_placements(args.placements, len(testbed.hosts)) if args.placements else []
    link = args.link or ("tc" if testbed.remote else "emulated")
    backends = list(args.backend)
    default_network = None if args.trace else "lan"
    networks = [x.strip() for x in (args.network or default_network or "").split(",") if x.strip()]
    inline = dict(exp.networks) if exp else {}
    if args.trace:
        trace = Path(args.trace).expanduser().resolve()
        traces.load(trace)  # a bad trace is one line now, not a failure in every worker
        name = f"trace-{trace.stem}"
        inline[name] = {"trace": str(trace)}
        networks.append(name)
    # Flags that set a field as it is come from the table; these combine flags or check them.
    return SweepOptions(**simple_fields(args), models=models, plans=plans, placements=placements, networks=networks,
                        backends=backends,
                        link=link, prefetch_batches=prefetch_from_args(args),
                        optimizations=not args.no_optimizations, report=not args.no_report, testbed=testbed,
                        ciphers=_ciphers(args.encrypt, backends, testbed),
                        transports=_transports(args.transport, backends),
                        stage_cpu=cpushare.parse_shares(args.stage_cpu, 2),
                        stage_cpu_trace=cputrace.parse_stage_traces(args.stage_cpu_trace),
                        stage_threads=_per_stage_ints(args.stage_threads, "--stage-threads"),
                        stage_devices=check_stage_devices(devices, stages) if not testbed.remote else [],
                        engines=_engines(args, stages),
                        dataset=kind.dataset or dataset_from_args(args, args.compression, local=not testbed.remote),
                        data_dir=args.data_dir, inline_networks=inline, objectives=args.objectives,
                        power_idle_w=_per_stage_floats(args.power_idle_w, "--power-idle-w", stages),
                        power_core_w=_per_stage_floats(args.power_core_w, "--power-core-w", stages),
                        memory_limits=_memory_limits(args.memory_limit, stages),
                        **_treatments(args), loadgen_settings=loadgen_sweep_settings(args, args.scenario))


def _engines(args: argparse.Namespace, stages: int) -> list[str]:
    """The engine labels a sweep passes over: --stage-engines' one engine per stage, else --engine's list."""
    if not args.stage_engines:
        return list(args.engine)
    if list(args.engine) != [engines.TORCH]:
        raise UsageError("--stage-engines sets every stage's engine: give it or --engine, not both")
    return [engines.stage_engines_label(args.stage_engines, stages)]


def _treatments(args: argparse.Namespace) -> dict[str, Any]:
    """The faults and wire dtypes a sweep passes over, each a pass of its own, and the deadline a
    fault sweep needs (--deadline-ms, else :data:`FAULT_DEADLINE_S`)."""
    faults = parse_faults(args.fault) if args.fault else [NO_FAULT]
    dtypes = list(dict.fromkeys(args.wire_dtype))
    deadline_s = args.deadline_ms / 1e3 if args.deadline_ms else FAULT_DEADLINE_S if faults != [NO_FAULT] else None
    return {"faults": faults, "deadline_s": deadline_s, "wire_dtype": dtypes[0],
            "wire_dtypes": dtypes if len(dtypes) > 1 else None}


def _per_stage_floats(text: str | None, flag: str, stages: int) -> list[float | None]:
    """``2.7,45`` (an empty entry: that stage's host decides) as watts per stage."""
    if not text:
        return []
    values: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part) if part else None
        except ValueError:
            raise UsageError(f"{flag} {text!r}: give watts per stage, e.g. 2.7,45")
        if value is not None and not 0 <= value < float("inf"):
            raise UsageError(f"{flag} {text!r}: watts must be 0 or more")
        values.append(value)
    if len(values) != stages:
        raise UsageError(f"{flag} {text!r}: give one value per stage ({stages})")
    return values


def _memory_limits(text: str | None, stages: int) -> list[int | None]:
    limits = parse_limits(text, stages)
    return [limits.get(f"stage{j}") for j in range(1, stages + 1)] if limits else []


def _ciphers(text: str, backends: list[str], testbed: Testbed) -> list[str]:
    """--encrypt's list, refused where it cannot apply: without a shared secret, or with the rpc
    backend alone (with --backend both the rpc runs stay plain)."""
    choices = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if not choices:
        raise UsageError(f"--encrypt {text!r} names no cipher; valid: {', '.join(aead.CHOICES)}")
    secret = load_secret(testbed.secret or "")
    for choice in choices:
        aead.check_choice(choice, secret)
    sealed = [c for c in choices if c != "none"]
    if sealed and "tcp" not in backends:
        raise UsageError(f"--encrypt {sealed[0]} seals the TCP data port; the rpc backend's TensorPipe channel "
                         f"cannot be sealed: use --backend tcp (or tcp,rpc, where the rpc runs stay plain)")
    return choices


def _transports(text: str, backends: list[str]) -> list[str]:
    """--transport's list, refused where it cannot apply: with the rpc backend alone (its
    TensorPipe channel is its own transport)."""
    choices = [messaging.check_transport(t) for t in dict.fromkeys(t.strip() for t in text.split(",") if t.strip())]
    if not choices:
        raise UsageError(f"--transport {text!r} names no transport; valid: {', '.join(messaging.TRANSPORTS)}")
    carried = [t for t in choices if t != "tcp"]
    if carried and "tcp" not in backends:
        raise UsageError(f"--transport {carried[0]} carries the TCP backend's frames; the rpc backend has its own "
                         f"channel: use --backend tcp (or tcp,rpc, where the rpc runs stay as they are)")
    return choices


def experiment_of(p: ArgumentParser, args: argparse.Namespace) -> experiment.Experiment | None:
    """What --config, --rerun or --resume contributes (a resumed session's own stored experiment)."""
    given = [flag for flag, value in (("--config", args.config), ("--rerun", args.rerun)) if value]
    if len(given) > 1 or (given and args.resume and args.rerun):
        raise UsageError(f"{' and '.join(given + (['--resume'] if args.resume else []))}: give one of --config, "
                         f"--rerun and --resume (--config may amend a --resume)")
    if args.rerun:
        folder = Path(args.rerun)
        exp = experiment.stored(folder, p)
        if exp is None:
            raise UsageError(f"--rerun {folder}: no {experiment.FILE_NAME} there; give a session folder written by "
                             f"a sweep (results/<timestamp>)")
        return exp
    base = None
    if args.resume:
        base = experiment.stored(sweep_session_dir(args.out, args.session, True), p)
    if args.config:
        exp = experiment.read(args.config, p)
        if base is not None:
            exp.defaults = {**base.defaults, **exp.defaults}
            exp.networks = {**base.networks, **exp.networks}
            exp.hosts = exp.hosts or base.hosts
            exp.resolved = base.resolved
        return exp
    return base
