"""The sweeper: model x split x profile x backend x run, resumable, with consolidated outputs.

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
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import cpushare, netem, records
from .errors import ParetoPipeError, PeerError, UsageError
from .link import Profile, get_profile
from .sshcmd import ssh_argv

log = logging.getLogger("paretopipe.sweep")
ROOT = Path(__file__).resolve().parent.parent

RUN_FIELDS = ["run_key", "config_key", "model", "backend", "profile", "split_index", "cut", "run", "status",
              "batch_size", "in_flight", "latency_median_s", "latency_mean_s", "latency_p95_s",
              "throughput_imgs_per_s", "transfer_median_s", "stage1_compute_median_s",
              "stage2_compute_median_s", "stage2_queue_median_s", "payload_bytes_mean", "wire_bytes_mean",
              "goodput_mbit_per_s", "measured_window_s", "batches_measured", "link_mode", "json"]
GROUP = ["model", "backend", "profile", "batch_size", "split_index"]


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
class Item:
    model: str
    backend: str
    profile: str
    split_index: int
    run: int

    @property
    def config_key(self) -> str:
        return f"{self.model}_{self.backend}_{self.profile}_k{self.split_index:02d}"

    @property
    def run_key(self) -> str:
        return f"{self.config_key}_r{self.run}"


@dataclasses.dataclass
class Hosts:
    """Where the stages run: local processes, or two hosts over SSH (from .env)."""

    stage1: str | None = None
    stage2: str | None = None
    user: str | None = None
    key: str | None = None
    remote_dir: str = "~/paretopipe"
    remote_python: str = "python3"
    port: int = 5555
    iface: str | None = None
    ssh_port: int | None = None
    known_hosts: str | None = None

    @property
    def remote(self) -> bool:
        return bool(self.stage1 and self.stage2)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Hosts":
        port = env.get("PORT", "5555")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"PORT={port!r} in .env is not a TCP port (1..65535)")
        return cls(stage1=env.get("PI1_IP") or None, stage2=env.get("PI2_IP") or env.get("GPU_IP") or None,
                   user=env.get("SSH_USER") or None, key=env.get("SSH_KEY") or None,
                   remote_dir=env.get("REMOTE_DIR") or "~/paretopipe",
                   remote_python=env.get("REMOTE_PYTHON") or "python3", port=int(port),
                   iface=env.get("IFACE") or None,
                   ssh_port=int(env["SSH_PORT"]) if env.get("SSH_PORT") else None,
                   known_hosts=env.get("SSH_KNOWN_HOSTS") or None)

    def ssh(self, host: str) -> list[str]:
        return ssh_argv(self.target(host), self.key, self.ssh_port, self.known_hosts)

    def runner(self, host: str | None) -> netem.Runner:
        if host is None:
            return netem.Runner()
        return netem.Runner(self.target(host), self.key, sudo=self.user not in (None, "root"),
                            ssh_port=self.ssh_port, known_hosts=self.known_hosts)

    def target(self, host: str) -> str:
        return f"{self.user}@{host}" if self.user else host


class Worker:
    """One stage process (``paretopipe.worker``); stopped by its PID, never by name."""

    def __init__(self, role: str, argv: list[str], ssh: list[str] | None = None) -> None:
        self.role, self.ssh = role, ssh
        self.lines: queue.Queue = queue.Queue()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, cwd=ROOT, start_new_session=True)
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.pid: int | None = None
        self.info: dict[str, Any] = {}

    def _pump(self, stream, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout:
                try:
                    self.lines.put(json.loads(line))
                except json.JSONDecodeError:
                    self.stderr_tail = (self.stderr_tail + [line])[-20:]
            else:
                self.stderr_tail = (self.stderr_tail + [line])[-20:]
        self.lines.put(None)

    def expect(self, *events: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerError(f"{self.role} worker gave no {'/'.join(events)} within {timeout:g}s")
            try:
                msg = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                tail = "".join(self.stderr_tail[-3:]).strip().replace("\n", " | ")
                raise PeerError(f"{self.role} worker exited (code {self.proc.poll()})" + (f": {tail}" if tail else ""))
            if msg.get("event") == "error":
                raise PeerError(f"{self.role}: {msg.get('error')}")
            if msg.get("event") in events:
                return msg

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise PeerError(f"{self.role} worker is gone")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ask politely, then signal the PID it reported (remote: over SSH), then kill."""
        if self.alive():
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(5)
            except (PeerError, subprocess.TimeoutExpired):
                pass
        if self.ssh and self.pid:
            subprocess.run(self.ssh + [f"kill -TERM {self.pid} 2>/dev/null; sleep 1; kill -KILL {self.pid} 2>/dev/null; true"],
                           capture_output=True, timeout=30)
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


@dataclasses.dataclass
class SweepOptions:
    models: list[str]
    splits: str = "all"
    runs: int = 3
    profiles: list[str] = dataclasses.field(default_factory=lambda: ["lan"])
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
    profiles_file: str | None = None
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
        self.profiles = {name: get_profile(name, opts.profiles_file) for name in opts.profiles}
        self.dir = self._session_dir()
        self.workers: dict[str, Worker] = {}
        self.failures: list[dict[str, Any]] = []
        self._rows: dict[str, tuple[int, dict[str, Any]]] = {}

    # -- layout --------------------------------------------------------------------------------
    def _session_dir(self) -> Path:
        out = Path(self.opts.out)
        if self.opts.session:
            return out / self.opts.session
        if self.opts.resume:
            sessions = sorted(p for p in out.glob("*/session.json"))
            if not sessions:
                raise UsageError(f"--resume: no session found under {out}")
            return max(sessions, key=lambda p: p.stat().st_mtime).parent
        return out / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    def run_path(self, item: Item) -> Path:
        return self.dir / "runs" / f"{item.run_key}.json"

    def done(self, item: Item) -> bool:
        try:
            return json.loads(self.run_path(item).read_text()).get("status") == "complete"
        except (OSError, json.JSONDecodeError):
            return False

    # -- plan ----------------------------------------------------------------------------------
    def plan(self, num_blocks: dict[str, int]) -> list[Item]:
        items = []
        for model in self.opts.models:
            splits = parse_splits(self.opts.splits, num_blocks[model])
            for backend in self.opts.backends:
                for profile in self.opts.profiles:
                    for k in splits:
                        for r in range(self.opts.runs):
                            items.append(Item(model, backend, profile, k, r))
        return items

    # -- workers -------------------------------------------------------------------------------
    def _worker_argv(self, role: str, model: str) -> tuple[list[str], list[str] | None]:
        o, h = self.opts, self.opts.hosts
        args = ["-m", "paretopipe.worker", "--role", role, "--model", model]
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
        remote = f"cd {shlex.quote(h.remote_dir)} && exec {h.remote_python} " + shlex.join(args)
        return ssh + [remote], ssh

    def start_workers(self, model: str) -> dict[str, Any]:
        self.stop_workers()
        infos = {}
        for role in ("stage1", "stage2"):
            argv, ssh = self._worker_argv(role, model)
            w = Worker(role, argv, ssh)
            self.workers[role] = w
        for role, w in self.workers.items():
            w.info = w.expect("ready", timeout=self.opts.wait_time)
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
    def run_one(self, item: Item, info: dict[str, Any], observed_link: dict | None) -> dict[str, Any]:
        o, h = self.opts, self.opts.hosts
        cut = info["block_cuts"][item.split_index]
        cfg = {"model": info["model"], "cuts": [cut], "split_index": item.split_index, "batch_size": o.batch_size,
               "num_batches": o.num_batches, "warmup": o.warmup, "in_flight": o.in_flight,
               "profile": item.profile, "link_mode": o.link, "timeout_s": o.timeout, "seed": item.run,
               "wire_dtype": o.wire_dtype, "compression": o.compression,
               "extra": {"sweep_run_key": item.run_key, "run": item.run}}
        profile = self.profiles[item.profile]
        s1, s2 = self.workers["stage1"], self.workers["stage2"]
        host = "0.0.0.0" if h.remote else "127.0.0.1"
        port = h.port if (h.remote or o.link == "tc") else 0  # tc shapes one known port
        s1.send({"cmd": "serve", "config": cfg, "host": host, "port": port,
                 "profile": profile.to_dict() if o.link == "emulated" else None,
                 "observed_link": observed_link, "connect_timeout": o.wait_time})
        listening = s1.expect("listening", timeout=o.wait_time)
        s2.send({"cmd": "connect", "config": cfg, "host": h.stage1 if h.remote else "127.0.0.1",
                 "port": listening["port"], "connect_timeout": o.wait_time, "observed_link": observed_link})
        budget = o.wait_time + o.timeout * (o.num_batches + o.warmup + 2)
        result = s2.expect("done", timeout=budget)
        s1.expect("done", timeout=o.wait_time)
        record = result["record"]
        record["config"]["profile"] = item.profile
        record["config"]["stage_limits"] = {"stage1": s1.info.get("limits"), "stage2": s2.info.get("limits")}
        if record["status"] != "complete":
            raise PeerError(record.get("error") or "run incomplete")
        return record

    def run_one_rpc(self, item: Item, info: dict[str, Any]) -> dict[str, Any]:
        """An RPC configuration: distributed_runner.py --local (master + 2 workers, fresh processes)."""
        import tempfile

        o = self.opts
        threads = o.threads or max(1, (os.cpu_count() or 1) // 2)
        with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            cmd = [sys.executable, str(ROOT / "distributed_runner.py"), "--local", "--world-size", "3",
                   "--model", item.model, "--split-block", str(item.split_index), "--batch-size", str(o.batch_size),
                   "--num-test-samples", str(o.num_batches * o.batch_size), "--warmup", str(o.warmup),
                   "--threads", str(threads), "--timeout", str(o.timeout), "--metrics-dir", tmp, "--quiet"]
            if o.in_flight > 1:
                cmd += ["--use-pipelining", "--in-flight", str(o.in_flight)]
            if o.link == "emulated":  # lan too, so the manifest says "emulated lan" as for TCP
                cmd += ["--profile", item.profile] + (["--profiles-file", o.profiles_file] if o.profiles_file else [])
            budget = o.wait_time + o.timeout * (o.num_batches + o.warmup + 2)
            try:
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget)
            except subprocess.TimeoutExpired:
                raise PeerError(f"rpc run exceeded {budget:g}s")
            found = list(Path(tmp).glob("*.json"))
            if proc.returncode != 0 or not found:
                lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
                raise PeerError(f"rpc: {lines[-1][7:] if lines else proc.stderr.strip()[-300:]}")
            record = json.loads(found[0].read_text())
        record["config"].update(profile=item.profile, sweep_run_key=item.run_key, run=item.run,
                                stage_limits={f"stage{i}": {"torch_threads": threads, "cpu_affinity": None}
                                              for i in (1, 2)})
        return record

    @staticmethod
    def _observed(profile: Profile, runner: netem.Runner, dev: str) -> dict[str, Any]:
        state = netem.observed_link_state(dev, runner)
        state["profile_requested"] = profile.to_dict()
        return state

    @contextlib.contextmanager
    def _tc_context(self, profile: Profile) -> Iterator[dict[str, Any] | None]:
        """With --link tc: apply the profile on each host's IFACE, data port only; cleared after."""
        h = self.opts.hosts
        if self.opts.link != "tc":
            yield None
            return
        with contextlib.ExitStack() as stack:
            runners = []
            for host in ([h.stage1, h.stage2] if h.remote else [None]):
                runner = h.runner(host)
                stack.enter_context(netem.applied(profile, h.iface, port=h.port, runner=runner))
                runners.append(runner)
            yield self._observed(profile, runners[0], h.iface)

    # -- the sweep -----------------------------------------------------------------------------
    def run(self) -> Path:
        from tqdm import tqdm

        o = self.opts
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        session = self._load_session()
        measured_s = 0.0
        interrupted = False
        total_items = 0
        try:
            for model in o.models:
                infos = self.start_workers(model)
                items = [i for i in self.plan({model: infos["stage1"]["num_blocks"]}) if i.model == model]
                total_items += len(items)
                todo = [i for i in items if not (o.resume and self.done(i))]
                skipped = len(items) - len(todo)
                bar = tqdm(total=len(items), initial=skipped, desc=model, unit="run", dynamic_ncols=True,
                           disable=None)
                for profile_name in o.profiles:
                    group = [i for i in todo if i.profile == profile_name]
                    if not group:
                        continue
                    with self._tc_context(self.profiles[profile_name]) as observed:
                        for item in group:
                            record = self._attempt(item, infos, observed, model)
                            if record is not None:
                                measured_s += record["summary"].get("measured_window_s") or 0.0
                            bar.update(1)
                            self.consolidate(session, started, measured_s, partial=True)
                bar.close()
                self.stop_workers()
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping workers; finished runs stay valid, --resume completes the rest")
        finally:
            self.stop_workers()
            session["interrupted"] = interrupted
            self.consolidate(session, started, measured_s, partial=False)
        if interrupted:
            raise KeyboardInterrupt
        if o.report:
            self._report()
        return self.dir

    def _attempt(self, item: Item, infos: dict[str, Any], observed: dict | None, model: str) -> dict | None:
        for attempt in (1, 2):
            try:
                if not all(w.alive() for w in self.workers.values()):
                    infos.update(self.start_workers(model))
                if item.backend == "rpc":
                    record = self.run_one_rpc(item, infos["stage1"])
                else:
                    record = self.run_one(item, infos["stage1"], observed)
                records.atomic_write_json(self.run_path(item), record)
                return record
            except (ParetoPipeError, OSError) as exc:
                self.failures.append({"run_key": item.run_key, "attempt": attempt, "error": str(exc),
                                      "time_utc": records.utc_now()})
                log.warning("%s attempt %d failed: %s", item.run_key, attempt, exc)
                if item.backend == "rpc":  # its own fresh processes; the TCP workers are untouched
                    continue
                # A half-finished exchange leaves workers in an unknown state: start them afresh.
                self.stop_workers()
                try:
                    infos.update(self.start_workers(model))
                except ParetoPipeError as exc2:
                    self.failures.append({"run_key": item.run_key, "attempt": attempt,
                                          "error": f"restart failed: {exc2}", "time_utc": records.utc_now()})
                    if attempt == 2:
                        raise
        return None

    def _load_session(self) -> dict[str, Any]:
        path = self.dir / "session.json"
        opts = dataclasses.asdict(self.opts)
        opts["hosts"] = {k: v for k, v in opts["hosts"].items() if k != "key"}
        session = {"schema_version": records.SCHEMA_VERSION, "created_utc": records.utc_now(),
                   "options": opts, "manifest": records.node_manifest(role="controller"),
                   "profiles": {n: p.to_dict() for n, p in self.profiles.items()}}
        if path.exists():
            try:
                old = json.loads(path.read_text())
                session["created_utc"] = old.get("created_utc", session["created_utc"])
                session["resumed_utc"] = old.get("resumed_utc", []) + [records.utc_now()]
                self.failures = old.get("failures", [])
            except (OSError, json.JSONDecodeError):
                pass
        return session

    # -- consolidation -------------------------------------------------------------------------
    def consolidate(self, session: dict[str, Any], started: float, measured_s: float, partial: bool) -> None:
        """runs.csv and session.json after every run; summary.csv (bootstrap CIs) at the end.

        The run JSONs are the source of truth, so a killed sweep loses nothing a later
        consolidation cannot rebuild. Parsed rows are cached: each run JSON is read once.
        """
        for path in (self.dir / "runs").glob("*.json"):
            stamp = path.stat().st_mtime_ns
            if self._rows.get(path.name, (None,))[0] != stamp:
                self._rows[path.name] = (stamp, run_row(json.loads(path.read_text()), path))
        rows = [row for _, (_, row) in sorted(self._rows.items())]
        records.atomic_write_csv(self.dir / "runs.csv", rows, RUN_FIELDS)
        if not partial:
            records.atomic_write_csv(self.dir / "summary.csv", summarize_runs(rows))
        records.atomic_write_csv(self.dir / "failures.csv", self.failures,
                                 ["run_key", "attempt", "error", "time_utc"])
        wall = time.monotonic() - started
        session.update({"updated_utc": records.utc_now(), "complete": not partial and not session.get("interrupted"),
                        "runs_complete": sum(r["status"] == "complete" for r in rows),
                        "timing": {"wall_s": wall, "measured_s": measured_s,
                                   "overhead_s": wall - measured_s,
                                   "overhead_ratio": (wall - measured_s) / measured_s if measured_s else None,
                                   "note": "measured_s sums the measured windows of this invocation's runs; "
                                           "overhead is everything else (start-up, model builds, warm-up, "
                                           "handshakes, writing)"},
                        "failures": self.failures})
        records.atomic_write_json(self.dir / "session.json", session)

    def _report(self) -> None:
        try:
            from . import report
        except ImportError:
            return
        report.write_report(self.dir, self.dir / "report")


def run_row(rec: dict[str, Any], path: Path) -> dict[str, Any]:
    s, c = rec["summary"], rec["config"]
    return {"run_key": c.get("sweep_run_key", rec["run_id"]),
            "config_key": (c.get("sweep_run_key") or rec["run_id"]).rsplit("_r", 1)[0],
            "model": c["model"], "backend": rec["backend"], "profile": c.get("profile"),
            "split_index": c.get("split_index"), "cut": ",".join(c.get("cuts", [])), "run": c.get("run"),
            "status": rec["status"], "batch_size": c["batch_size"], "in_flight": c["in_flight"],
            **{k: s.get(k) for k in RUN_FIELDS if k in s},
            "link_mode": rec["manifest"]["link"].get("mode"), "json": f"runs/{path.name}"}


def summarize_runs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model/backend/profile/batch/split: median, p95 and 95% CI over runs."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "complete":
            groups.setdefault(tuple(row[k] for k in GROUP), []).append(row)
    out = []
    for key, members in sorted(groups.items(), key=lambda kv: tuple((0, x, "") if isinstance(x, int) else (1, 0, str(x))
                                                                        for x in kv[0])):
        entry = dict(zip(GROUP, key))
        entry["cut"] = members[0]["cut"]
        entry["runs"] = len(members)
        # Over runs: median, p95 and a bootstrap 95% CI of the median (units end each name).
        for metric, stem, unit in (("latency_median_s", "latency_median", "_s"),
                                   ("throughput_imgs_per_s", "throughput", "_imgs_per_s")):
            xs = [m[metric] for m in members if m.get(metric) is not None]
            lo, hi = records.bootstrap_ci(xs)
            entry[metric] = float(np.median(xs)) if xs else None
            entry[f"{stem}_p95{unit}"] = float(np.percentile(xs, 95)) if xs else None
            entry[f"{stem}_ci95_low{unit}"] = lo
            entry[f"{stem}_ci95_high{unit}"] = hi
        for metric in ("latency_p95_s", "transfer_median_s", "stage1_compute_median_s", "stage2_compute_median_s",
                       "goodput_mbit_per_s"):
            xs = [m[metric] for m in members if m.get(metric) is not None]
            entry[metric] = float(np.median(xs)) if xs else None
        pay = [m["payload_bytes_mean"] for m in members if m.get("payload_bytes_mean") is not None]
        entry["payload_bytes_mean"] = float(np.mean(pay)) if pay else None
        out.append(entry)
    return out


def describe_plan(items: Sequence[Item], opts: SweepOptions) -> str:
    per = opts.warmup + opts.num_batches
    lines = [f"{len(items)} runs: models {', '.join(opts.models)} x backends {', '.join(opts.backends)} x "
             f"profiles {', '.join(opts.profiles)} x splits ({opts.splits}) x {opts.runs} runs; "
             f"{per} batches of {opts.batch_size} each ({opts.warmup} warm-up)"]
    lines += [f"  {i.run_key}" for i in items[:10]]
    if len(items) > 10:
        lines.append(f"  ... and {len(items) - 10} more")
    return "\n".join(lines)
