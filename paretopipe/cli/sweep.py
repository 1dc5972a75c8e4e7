"""``automated_split_tester.py`` and ``paretopipe sweep``: every split under every named network condition."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Sequence

from .. import cpushare
from ..errors import UsageError
from ..runners.hosts import Hosts
from ..runners.sweep import SweepOptions, Sweeper, describe_plan
from .common import ArgumentParser, HelpFormatter, add_common_flags, example_epilog, setup_logging

log = logging.getLogger("paretopipe.sweep")


def parser(prog: str = "automated_split_tester.py") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Run every split point of a model under every named network condition, collect the run "
                    "records, consolidate them (runs.csv, summary.csv, failures.csv, session.json) and "
                    "write the Pareto report. Local (both stages on this machine) unless .env names hosts.",
        epilog=example_epilog(
            "python automated_split_tester.py --model mobilenetv2 --splits all --runs 3 --network lan,wifi,lte",
            "python automated_split_tester.py --models resnet18,resnet50 --splits 1-8 --in-flight 4",
            "python automated_split_tester.py --model mobilenetv2 --dry-run",
            "python automated_split_tester.py --model mobilenetv2 --resume --out results"))
    p.add_argument("--model", default=None, help="one model (default mobilenetv2)")
    p.add_argument("--models", default=None, help="comma list of models")
    p.add_argument("--splits", default="all", help="all, a list 1,4,8, or ranges 2-10 (0 and K are the baselines)")
    p.add_argument("--runs", type=int, default=3, help="repetitions per configuration")
    p.add_argument("--network", "--networks", "--profiles", dest="network", default="lan",
                   help="comma list of named network conditions from profiles.toml (--profiles is the anchor's name)")
    p.add_argument("--network-file", "--profiles-file", dest="network_file", default=None,
                   help="a TOML file of named network conditions (default: the shipped profiles.toml)")
    p.add_argument("--backend", default="tcp", choices=["tcp", "rpc", "both"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-batches", type=int, default=20, help="measured batches per run")
    p.add_argument("--warmup", type=int, default=3, help="warm-up batches per run (per configuration)")
    p.add_argument("--in-flight", type=int, default=1, help="pipelining window")
    p.add_argument("--wire-dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--compression", default="none", choices=["none", "zstd", "lz4"])
    p.add_argument("--link", default=None, choices=["emulated", "tc", "none"],
                   help="emulated (local default): in-process link; tc: network_delay on the hosts' IFACE; none")
    p.add_argument("--iface", default=None, help="with --link tc: interface to shape (default IFACE from .env)")
    p.add_argument("--out", default="results", help="results folder; each sweep is a session inside it")
    p.add_argument("--session", default=None, help="session folder name (default: a timestamp)")
    p.add_argument("--resume", action="store_true", help="continue the newest (or --session) session, skipping completed runs")
    p.add_argument("--wait-time", type=float, default=120.0, help="readiness timeout for stage processes, seconds")
    p.add_argument("--timeout", type=float, default=60.0, help="per-batch timeout inside a run, seconds")
    p.add_argument("--threads", type=int, default=None, help="torch threads per stage (default: cores/2)")
    p.add_argument("--stage-cpu", default=None,
                   help="CPU share per stage via cgroup quota, e.g. 0.25,1 (an edge device and a server on "
                        "one machine; local TCP only)")
    p.add_argument("--stage-threads", default=None, help="torch threads per stage, e.g. 1,2 (overrides --threads)")
    p.add_argument("--cleanup", action="store_true", help="delete per-run JSONs after consolidation (CSVs stay)")
    p.add_argument("--no-optimizations", action="store_true",
                   help="do not pin stages to separate cores (the anchor's behaviour; for comparisons)")
    p.add_argument("--no-report", action="store_true", help="skip the Pareto report at the end")
    p.add_argument("--local", action="store_true", help="ignore hosts in .env and run both stages here")
    p.add_argument("--env-file", default=".env")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its size; run nothing")
    add_common_flags(p)
    return p


def _env(path: str) -> dict[str, str]:
    from dotenv import dotenv_values

    values = {k: v for k, v in dotenv_values(path).items() if v is not None} if os.path.exists(path) else {}
    keys = ("PI1_IP", "PI2_IP", "GPU_IP", "SSH_USER", "SSH_KEY", "SSH_PORT", "SSH_KNOWN_HOSTS", "REMOTE_DIR",
            "REMOTE_PYTHON", "PORT", "IFACE")
    values.update({k: os.environ[k] for k in keys if os.environ.get(k)})
    return values


def options_from_args(args: argparse.Namespace) -> SweepOptions:
    models = [m.strip() for m in (args.models or args.model or "mobilenetv2").split(",") if m.strip()]
    hosts = Hosts() if args.local else Hosts.from_env(_env(args.env_file))
    if args.iface:
        hosts.iface = args.iface
    link = args.link or ("tc" if hosts.remote else "emulated")
    backends = ["tcp", "rpc"] if args.backend == "both" else [args.backend]
    for name in ("runs", "batch_size", "in_flight"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    return SweepOptions(models=models, splits=args.splits, runs=args.runs,
                        networks=[x.strip() for x in args.network.split(",") if x.strip()], backends=backends,
                        batch_size=args.batch_size, num_batches=args.num_batches, warmup=args.warmup,
                        in_flight=args.in_flight, link=link, out=args.out, session=args.session,
                        resume=args.resume, wait_time=args.wait_time, timeout=args.timeout, threads=args.threads,
                        optimizations=not args.no_optimizations, dry_run=args.dry_run, cleanup=args.cleanup,
                        report=not args.no_report, hosts=hosts, network_file=args.network_file,
                        wire_dtype=args.wire_dtype, compression=args.compression,
                        stage_cpu=cpushare.parse_shares(args.stage_cpu, 2),
                        stage_threads=_stage_threads(args.stage_threads))


def _stage_threads(text: str | None) -> list[int | None]:
    if not text:
        return [None, None]
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 2 or min(values) < 1:
        raise UsageError(f"--stage-threads {text!r}: give two positive integers, one per stage, e.g. 1,2")
    return values


def main(argv: Sequence[str] | None = None, prog: str = "automated_split_tester.py") -> int:
    args = parser(prog).parse_args(argv)
    setup_logging(args.debug, args.quiet)
    opts = options_from_args(args)
    sweeper = Sweeper(opts)
    if opts.dry_run:
        from ..partition.structure import structure

        blocks = {m: structure(m)["num_blocks"] for m in opts.models}
        print(describe_plan(sweeper.plan(blocks), opts))
        return 0
    where = f"{opts.hosts.stage1} -> {opts.hosts.stage2} over SSH" if opts.hosts.remote else "locally"
    log.info("sweep %s, link %s, results in %s", where, opts.link, sweeper.dir)
    out = sweeper.run()
    if opts.cleanup:
        for path in (out / "runs").glob("*.json"):
            path.unlink()
    if opts.report and (out / "report" / "pareto.csv").is_file():
        import pandas as pd

        from ..analysis.report import format_front_table

        print("Pareto-optimal splits (latency_s: median per batch; throughput in images/s):")
        print(format_front_table(pd.read_csv(out / "report" / "pareto.csv")))
    print(f"sweep done: {out} (runs.csv, summary.csv, failures.csv, session.json"
          + (", report/" if opts.report else "") + ")")
    return 0
