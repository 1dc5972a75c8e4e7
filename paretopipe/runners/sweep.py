"""The sweeper: model x split x network x backend x run, resumable, with consolidated outputs.

Stage processes are started once per model (locally, pinned to different cores, or over SSH)
and re-partitioned in place for each configuration. A configuration that fails is recorded,
retried once, and the sweep goes on. Every file is written atomically, so killing the sweep at
any moment loses at most the configuration in flight; ``--resume`` finishes what is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from .. import cpushare, records
from ..analysis.session import Session, config_key, run_key
from ..errors import ParetoPipeError, PeerError, UsageError
from ..manifest import node_manifest
from ..network import tc
from ..network.conditions import NetworkConditions, get_conditions
from ..transport.runconfig import RunConfig
from .hosts import Hosts, StageProcess

log = logging.getLogger("paretopipe.sweep")


def parse_splits(text: str, num_blocks: int) -> list[int]:
    """``all``, ``1,4,8``, ``2-10`` or a mix, each within 0..K (0 and K are the baselines)."""
    if text.strip().lower() == "all":
        return list(range(num_blocks + 1))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise UsageError(f"bad --splits {text!r}: use all, a list like 1,4,8 or a range like 2-10")
    bad = [k for k in out if not 0 <= k <= num_blocks]
    if bad:
        raise UsageError(f"split index {bad[0]} out of range: valid 0..{num_blocks} "
                         f"(0 = all on stage 2, {num_blocks} = all on stage 1)")
    return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: a configuration (model, backend, network, split) and its repetition."""

    model: str
    backend: str
    network: str
    split_index: int
    run: int

    @property
    def config_key(self) -> str:
        return config_key(self.model, self.backend, self.network, self.split_index)

    @property
    def run_key(self) -> str:
        return run_key(self.config_key, self.run)


@dataclasses.dataclass
class SweepOptions:
    models: list[str]
    splits: str = "all"
    runs: int = 3
    networks: list[str] = dataclasses.field(default_factory=lambda: ["lan"])
    backends: list[str] = dataclasses.field(default_factory=lambda: ["tcp"])
    batch_size: int = 8
    num_batches: int = 20
    warmup: int = 3
    in_flight: int = 1
    link: str = "emulated"
    out: str = "results"
    session: str | None = None
    resume: bool = False
    wait_time: float = 120.0
    timeout: float = 60.0
    threads: int | None = None
    optimizations: bool = True
    dry_run: bool = False
    cleanup: bool = False
    report: bool = True
    hosts: Hosts = dataclasses.field(default_factory=Hosts)
    network_file: str | None = None
    wire_dtype: str = "float32"
    compression: str = "none"
    stage_cpu: list[float | None] = dataclasses.field(default_factory=lambda: [None, None])
    stage_threads: list[int | None] = dataclasses.field(default_factory=lambda: [None, None])


class Sweeper:
    def __init__(self, opts: SweepOptions) -> None:
        self.opts = opts
        unknown = [b for b in opts.backends if b not in ("tcp", "rpc")]
        if unknown:
            raise UsageError(f"unknown backend {unknown[0]!r}; valid: tcp, rpc, both")
        if "rpc" in opts.backends and opts.hosts.remote:
            raise UsageError("the sweeper runs the rpc backend locally only; for hosts, start "
                             "distributed_runner.py on each (see its --help) or use --backend tcp")
        if opts.link not in ("emulated", "tc", "none"):
            raise UsageError(f"--link {opts.link!r}: valid emulated, tc, none")
        if opts.link == "tc" and not (opts.hosts.iface):
            raise UsageError("--link tc needs IFACE (in .env or --iface) to shape")
        if any(x is not None for x in opts.stage_cpu):
            if opts.hosts.remote:
                raise UsageError("--stage-cpu emulates slower devices on this machine; with hosts in .env the "
                                 "stages already run on real devices (use --local to emulate)")
            if "rpc" in opts.backends:
                raise UsageError("--stage-cpu applies to the TCP backend's stage workers; use --backend tcp")
            cpushare.Hierarchy.detect()  # a clear error now rather than from every worker
        self.networks = {name: get_conditions(name, opts.network_file) for name in opts.networks}
        self.session = Session(self._session_dir())
        self.dir = self.session.path
        self.workers: dict[str, StageProcess] = {}
        self.failures: list[dict[str, Any]] = []

    # -- layout --------------------------------------------------------------------------------
    def _session_dir(self) -> Path:
        out = Path(self.opts.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder for the sessions")
        if self.opts.session:
            return out / self.opts.session
        if self.opts.resume:
            sessions = sorted(p for p in out.glob("*/session.json"))
            if not sessions:
                raise UsageError(f"--resume: no session found under {out}")
            return max(sessions, key=lambda p: p.stat().st_mtime).parent
        return out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    # -- plan ----------------------------------------------------------------------------------
    def plan(self, num_blocks: dict[str, int]) -> list[PlannedRun]:
        planned = []
        for model in self.opts.models:
            splits = parse_splits(self.opts.splits, num_blocks[model])
            for backend in self.opts.backends:
                for network in self.opts.networks:
                    for k in splits:
                        for r in range(self.opts.runs):
                            planned.append(PlannedRun(model, backend, network, k, r))
        return planned

    # -- workers -------------------------------------------------------------------------------
    def _worker_argv(self, role: str, model: str) -> tuple[list[str], list[str] | None]:
        o, h = self.opts, self.opts.hosts
        args = ["-m", "paretopipe.runners.worker", "--role", role, "--model", model]
        cores = os.cpu_count() or 1
        index = 0 if role == "stage1" else 1
        threads = o.stage_threads[index] or o.threads or max(1, cores // 2)
        args += ["--threads", str(threads)]
        if o.stage_cpu[index] is not None:
            args += ["--cpu-share", repr(o.stage_cpu[index])]
        if not h.remote:
            if o.optimizations and cores >= 2:
                half = cores // 2
                cpus = f"0-{half - 1}" if role == "stage1" else f"{half}-{2 * half - 1}"
                args += ["--cpus", cpus]
            return [sys.executable, *args], None
        ssh = h.ssh(h.stage1 if role == "stage1" else h.stage2)
        remote = f"cd {shlex.quote(h.remote_dir)} && exec {shlex.quote(h.remote_python)} " + shlex.join(args)
        return ssh + [remote], ssh

    def start_workers(self, model: str) -> dict[str, Any]:
        self.stop_workers()
        infos = {}
        for role in ("stage1", "stage2"):
            argv, ssh = self._worker_argv(role, model)
            self.workers[role] = StageProcess(role, argv, ssh)
        for role, w in self.workers.items():
            w.info = w.expect("ready", timeout=self.opts.wait_time)
            if not isinstance(w.info.get("pid"), int):
                raise PeerError(f"{role} worker reported no numeric pid")
            w.pid = w.info["pid"]
            infos[role] = w.info
        if infos["stage1"]["fingerprint"] != infos["stage2"]["fingerprint"]:
            raise PeerError(f"the two hosts build different weights for {model} "
                            f"({infos['stage1']['fingerprint']} vs {infos['stage2']['fingerprint']}): "
                            f"check torch versions and models/*.pth")
        return infos

    def stop_workers(self) -> None:
        for w in self.workers.values():
            w.stop()
        if self.workers and any(x is not None for x in self.opts.stage_cpu):
            cpushare.remove_stale()  # groups of workers that could not clean up after themselves
        self.workers = {}

    # -- one configuration ---------------------------------------------------------------------
    def run_config(self, planned: PlannedRun, info: dict[str, Any], **extra: Any) -> RunConfig:
        """The typed configuration of one planned run; the record's ``config`` is exactly this."""
        o = self.opts
        return RunConfig(model=info["model"], cuts=[info["block_cuts"][planned.split_index]],
                         split_index=planned.split_index, batch_size=o.batch_size, num_batches=o.num_batches,
                         warmup=o.warmup, in_flight=o.in_flight, network=planned.network, link_mode=o.link,
                         timeout_s=o.timeout, seed=planned.run, wire_dtype=o.wire_dtype,
                         compression=o.compression, run_key=planned.run_key, config_key=planned.config_key,
                         run=planned.run, **extra)

    def run_one(self, planned: PlannedRun, info: dict[str, Any], observed_link: dict | None) -> dict[str, Any]:
        o, h = self.opts, self.opts.hosts
        s1, s2 = self.workers["stage1"], self.workers["stage2"]
        cfg = self.run_config(planned, info, stage_limits={"stage1": s1.info.get("limits"),
                                                           "stage2": s2.info.get("limits")}).to_dict()
        conditions = self.networks[planned.network]
        host = "0.0.0.0" if h.remote else "127.0.0.1"
        port = h.port if (h.remote or o.link == "tc") else 0  # tc shapes one known port
        s1.send({"cmd": "serve", "config": cfg, "host": host, "port": port,
                 "conditions": conditions.to_dict() if o.link == "emulated" else None,
                 "observed_link": observed_link, "connect_timeout": o.wait_time})
        listening = s1.expect("listening", timeout=o.wait_time)
        s2.send({"cmd": "connect", "config": cfg, "host": h.stage1 if h.remote else "127.0.0.1",
                 "port": listening["port"], "connect_timeout": o.wait_time, "observed_link": observed_link})
        budget = o.wait_time + o.timeout * (o.num_batches + o.warmup + 2)
        result = s2.expect("done", timeout=budget)
        s1.expect("done", timeout=o.wait_time)
        record = result.get("record")
        if not isinstance(record, dict) or not isinstance(record.get("summary"), dict):
            raise PeerError("stage 2 returned no run record")
        if record["status"] != "complete":
            raise PeerError(record.get("error") or "run incomplete")
        return record

    def run_one_rpc(self, planned: PlannedRun) -> dict[str, Any]:
        """An RPC configuration: the RPC ranks with --local (master + 2 workers, fresh processes)."""
        o = self.opts
        threads = o.threads or max(1, (os.cpu_count() or 1) // 2)
        with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            cmd = [sys.executable, "-m", "paretopipe.cli.rpc", "--local", "--world-size", "3",
                   "--model", planned.model, "--split-block", str(planned.split_index),
                   "--batch-size", str(o.batch_size), "--num-test-samples", str(o.num_batches * o.batch_size),
                   "--warmup", str(o.warmup), "--threads", str(threads), "--timeout", str(o.timeout),
                   "--metrics-dir", tmp, "--network-label", planned.network, "--run-key", planned.run_key,
                   "--config-key", planned.config_key, "--run", str(planned.run), "--quiet"]
            if o.in_flight > 1:
                cmd += ["--use-pipelining", "--in-flight", str(o.in_flight)]
            if o.link == "emulated":  # lan too, so the manifest says "emulated lan" as for TCP
                cmd += ["--network", planned.network] + (["--network-file", o.network_file] if o.network_file else [])
            budget = o.wait_time + o.timeout * (o.num_batches + o.warmup + 2)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
            except subprocess.TimeoutExpired:
                raise PeerError(f"rpc run exceeded {budget:g}s")
            found = list(Path(tmp).glob("*.json"))
            if proc.returncode != 0 or not found:
                lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
                raise PeerError(f"rpc: {lines[-1][7:] if lines else proc.stderr.strip()[-300:]}")
            return json.loads(found[0].read_text())

    @staticmethod
    def _observed(conditions: NetworkConditions, runner: tc.Runner, dev: str) -> dict[str, Any]:
        state = tc.observed_link_state(dev, runner)
        state["conditions_requested"] = conditions.to_dict()
        return state

    @contextlib.contextmanager
    def _tc_context(self, conditions: NetworkConditions) -> Iterator[dict[str, Any] | None]:
        """With --link tc: apply the conditions on each host's IFACE, data port only; cleared after.
        Stage 1's host shapes its egress with the up direction, stage 2's with the down one."""
        h = self.opts.hosts
        if self.opts.link != "tc":
            yield None
            return
        with contextlib.ExitStack() as stack:
            runners = []
            hosts = [(h.stage1, conditions.up), (h.stage2, conditions.down)] if h.remote else [(None, conditions.up)]
            for host, direction in hosts:
                runner = h.runner(host)
                stack.enter_context(tc.applied(direction, h.iface, port=h.port, runner=runner))
                runners.append(runner)
            yield self._observed(conditions, runners[0], h.iface)

    # -- the sweep -----------------------------------------------------------------------------
    def run(self) -> Path:
        from tqdm import tqdm

        o = self.opts
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self._load_session()
        measured_s = 0.0
        interrupted = False
        try:
            for model in o.models:
                infos = self.start_workers(model)
                planned = [p for p in self.plan({model: infos["stage1"]["num_blocks"]}) if p.model == model]
                todo = [p for p in planned if not (o.resume and self.session.completed(p.run_key))]
                bar = tqdm(total=len(planned), initial=len(planned) - len(todo), desc=model, unit="run",
                           dynamic_ncols=True, disable=None)
                for network in o.networks:
                    group = [p for p in todo if p.network == network]
                    if not group:
                        continue
                    with self._tc_context(self.networks[network]) as observed:
                        for one in group:
                            record = self._attempt(one, infos, observed, model)
                            if record is not None:
                                measured_s += record["summary"].get("measured_window_s") or 0.0
                            bar.update(1)
                            self.consolidate(meta, started, measured_s, final=False)
                bar.close()
                self.stop_workers()
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping workers; finished runs stay valid, --resume completes the rest")
        finally:
            self.stop_workers()
            meta["interrupted"] = interrupted
            self.consolidate(meta, started, measured_s, final=True)
        if interrupted:
            raise KeyboardInterrupt
        if o.report:
            self._report()
        return self.dir

    def _attempt(self, planned: PlannedRun, infos: dict[str, Any], observed: dict | None,
                 model: str) -> dict | None:
        for attempt in (1, 2):
            try:
                if not all(w.alive() for w in self.workers.values()):
                    infos.update(self.start_workers(model))
                if planned.backend == "rpc":
                    record = self.run_one_rpc(planned)
                else:
                    record = self.run_one(planned, infos["stage1"], observed)
                self.session.write_run(planned.run_key, record)
                return record
            except (ParetoPipeError, OSError) as exc:
                self.failures.append({"run_key": planned.run_key, "attempt": attempt, "error": str(exc),
                                      "time_utc": records.utc_now()})
                log.warning("%s attempt %d failed: %s", planned.run_key, attempt, exc)
                if planned.backend == "rpc":  # its own fresh processes; the TCP workers are untouched
                    continue
                # A half-finished exchange leaves workers in an unknown state: start them afresh.
                self.stop_workers()
                try:
                    infos.update(self.start_workers(model))
                except ParetoPipeError as exc2:
                    self.failures.append({"run_key": planned.run_key, "attempt": attempt,
                                          "error": f"restart failed: {exc2}", "time_utc": records.utc_now()})
                    if attempt == 2:
                        raise
        return None

    def _load_session(self) -> dict[str, Any]:
        opts = dataclasses.asdict(self.opts)
        opts["hosts"] = {k: v for k, v in opts["hosts"].items() if k != "key"}
        meta = {"schema_version": records.SCHEMA_VERSION, "created_utc": records.utc_now(),
                "options": opts, "manifest": node_manifest(role="controller"),
                "networks": {n: c.to_dict() for n, c in self.networks.items()}}
        try:
            old = self.session.read_meta()
        except UsageError as exc:
            log.warning("%s: starting the session file afresh", exc)
            old = None
        if old is not None:
            meta["created_utc"] = old.get("created_utc", meta["created_utc"])
            meta["resumed_utc"] = list(old.get("resumed_utc") or []) + [records.utc_now()]
            self.failures = list(old.get("failures") or [])
        return meta

    # -- consolidation -------------------------------------------------------------------------
    def consolidate(self, meta: dict[str, Any], started: float, measured_s: float, final: bool) -> None:
        """runs.csv and session.json after every run; summary.csv (bootstrap CIs) at the end.

        The run JSONs are the source of truth, so a killed sweep loses nothing a later
        consolidation cannot rebuild.
        """
        rows, skipped = self.session.consolidate(self.failures, final)
        wall = time.monotonic() - started
        meta.update({"updated_utc": records.utc_now(), "complete": final and not meta.get("interrupted"),
                     "runs_complete": sum(r["status"] == "complete" for r in rows),
                     "unreadable_runs": skipped,
                     "timing": {"wall_s": wall, "measured_s": measured_s,
                                "overhead_s": wall - measured_s,
                                "overhead_ratio": (wall - measured_s) / measured_s if measured_s else None,
                                "note": "measured_s sums the measured windows of this invocation's runs; "
                                        "overhead is everything else (start-up, model builds, warm-up, "
                                        "handshakes, writing)"},
                     "failures": self.failures})
        self.session.write_meta(meta)

    def _report(self) -> None:
        from ..analysis import report

        report.write_report(self.dir, self.dir / "report")


def describe_plan(planned: Sequence[PlannedRun], opts: SweepOptions) -> str:
    per = opts.warmup + opts.num_batches
    lines = [f"{len(planned)} runs: models {', '.join(opts.models)} x backends {', '.join(opts.backends)} x "
             f"networks {', '.join(opts.networks)} x splits ({opts.splits}) x {opts.runs} runs; "
             f"{per} batches of {opts.batch_size} each ({opts.warmup} warm-up)"]
    lines += [f"  {p.run_key}" for p in planned[:10]]
    if len(planned) > 10:
        lines.append(f"  ... and {len(planned) - 10} more")
    return "\n".join(lines)
