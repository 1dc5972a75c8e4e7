"""The sweep's loop: worker groups started in turn, rounds of runs, retries on fresh processes,
resuming, and the closing report; what it measured is kept by its ledger (:mod:`.ledger`: atomic
writes, a full disk stopping the sweep, consolidation)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from ... import records
from ...compute import cpushare
from ...analysis.session import Session, SessionMeta, sweep_session_dir
from ...analysis.keys import CLOSED_LOOP, NO_FAULT, NO_PLACEMENT, NO_PROMPT, ConfigKey
from ...analysis.columns import cipher_of
from ...errors import ParetoPipeError, PeerError
from ...network.linkdown import LinkDown
from ...records import COMPLETE, INFEASIBLE
from ...runrecord import RunRecord
from ...transport import messaging
from ...transport.messaging.broker import Broker
from ...transport.runconfig import RunConfig
from .. import zygote
from . import rounds
from . import configure
from .drift import drift_check, requeue_drifted
from .ledger import DiskFullError, SweepLedger
from .group import GroupFactory, GroupInfo, GroupPass, GroupProgress, StageGroup, process_group
from .options import SweepOptions, check_cpu_emulation, check_options
from .placements import pass_options
from .plan import PlannedRun, round_plan, segments, settings_of, splits_for, worker_groups
from .shaping import Shaped, tc_applied

log = logging.getLogger("paretopipe.sweep")
#: runs.csv and session.json are rebuilt at most this often during a sweep (and at its end); the
#: run records, written after every run, are the source of truth either way.
CONSOLIDATE_EVERY_S = 5.0


@dataclasses.dataclass
class SweepResult:
    path: Path
    configurations: int
    failed: list[PlannedRun]
    measured: int = 0  # runs recorded (complete or infeasible), resumed ones included


class Sweeper:
    """One sweep: every worker group (model, backend, cipher) started in turn, its configurations
    measured in rounds until each one's stopping rule is met, every run written as it ends."""

    def __init__(self, opts: SweepOptions, group_factory: GroupFactory | None = None) -> None:
        self.group_factory = group_factory or process_group
        self.retarget(opts)
        self.session = Session(sweep_session_dir(opts.out, opts.session, opts.resume))
        self.dir = self.session.path
        self.ledger = SweepLedger(self.session)
        self.group: StageGroup | None = None
        self.info: GroupInfo | None = None  # the current group's report (start)
        # (model, backend, cuts) this worker group has already run: their one-time costs (lazy
        # init, kernel selection for the shapes, allocator growth) are paid, so later runs of the
        # same cut skip the warm-up unless --warmup-every-run (without it the demo's 1 warm-up
        # batch per 10 measured was 0.04 s of a run's 0.06 s overhead).
        self.warmed: set[tuple] = set()
        self.compute_s = 0.0  # the slowest batch compute (all stages) measured in this worker group
        self.cipher = "none"  # the current worker group's --encrypt choice
        self.transport = "tcp"  # ...and its --transport
        self.group_pass = GroupPass("tcp")  # ...and the load and prompt its runs are measured under
        self.broker: Broker | None = None  # MQTT's, started by the first MQTT group of a local sweep
        self.cipher_used: str | None = None  # ...and the cipher its runs record (auto resolved)
        self._model: str | None = None  # the model the current group's processes hold
        self.groups_started = 0  # worker groups this sweeper started (a search's trials share one)
        self.link_down: LinkDown | None = None  # the link --link tc shapes now: link:down takes it down

    def retarget(self, opts: SweepOptions) -> None:
        """Measure ``opts`` next (a search's next trial, in the same session): the worker group
        started for the last options is kept where the next pass runs on the same one."""
        check_options(opts)
        self.opts = opts
        self.networks = {name: opts.conditions(name) for name in opts.networks}
        if any(c.cpu_traces for c in self.networks.values()):
            check_cpu_emulation(opts, "a network's cpu_trace")

    @property
    def scenario(self) -> str:
        """The LoadGen scenario the current pass is measured under (the closed loop: none)."""
        return self.group_pass.scenario

    # -- layout --------------------------------------------------------------------------------
    def discard_if_unmeasured(self) -> bool:
        """Remove this session's folder when no run (nor reference run) was recorded in it."""
        if not self.dir.is_dir() or self.session.measured_anything():
            return False
        shutil.rmtree(self.dir, ignore_errors=True)
        return True

    # -- processes -----------------------------------------------------------------------------
    def start(self, model: str, backend: str, cipher: str = "none", transport: str = "tcp") -> GroupInfo:
        """Start the stage group of (model, backend) under ``cipher`` over ``transport``; its report
        is the current :attr:`info` until the next start."""
        self.stop()
        self.warmed.clear()
        self.compute_s = 0.0
        self.cipher, self.cipher_used = cipher, None
        self.transport = transport
        self.group = self.group_factory(self, model, backend)
        self.groups_started += 1
        try:
            self.info = GroupInfo.of(self.group.start())
        except BaseException:
            self.stop()
            raise
        return self.info

    def close(self) -> None:
        """Stop the worker group and the MQTT broker this sweeper started (a kept group's end)."""
        self.stop()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
            if any(x is not None for x in self.opts.stage_cpu) or self.traced_stages():
                cpushare.remove_stale()  # groups of workers that could not clean up after themselves

    def mqtt_users(self, stages: int) -> list[dict[str, Any]] | None:
        """Each stage's MQTT settings for the current group: a broker this sweep starts here (one
        user per stage, the session's own namespace), or with hosts the one .env names."""
        if self.transport != "mqtt":
            return None
        qos = int(self.opts.mqtt_qos)
        if self.opts.testbed.remote:
            settings = messaging.MqttSettings.from_env(self.opts.testbed.mqtt_env, qos)
            return [dataclasses.asdict(settings)] * stages
        if self.broker is None:
            self.broker = Broker(users=[f"stage{j + 1}" for j in range(max(stages, 3))],
                                 namespace=f"paretopipe/{records.file_label(self.dir.name)}")
            log.info("MQTT broker for this sweep on %s:%d", self.broker.host, self.broker.port)
        return [dataclasses.asdict(self.broker.settings(f"stage{j + 1}", qos)) for j in range(stages)]

    def broker_address(self) -> tuple[str, int] | None:
        """The current group's MQTT broker (host, port): what --link tc shapes; None off MQTT."""
        if self.transport != "mqtt":
            return None
        if self.opts.testbed.remote:
            settings = messaging.MqttSettings.from_env(self.opts.testbed.mqtt_env)
            return settings.host, settings.port
        return (self.broker.host, self.broker.port) if self.broker is not None else None

    def traced_stages(self) -> set[str]:
        """Stages some run of the sweep replays a compute trace on (their workers need a group)."""
        return set(self.opts.stage_cpu_trace) | {s for c in self.networks.values() for s, _ in c.cpu_traces}

    # -- one configuration ---------------------------------------------------------------------
    def run_config(self, planned: PlannedRun) -> RunConfig:
        """The typed configuration of one planned run in the current group; the record's ``config``
        is exactly this."""
        o, info = self.opts, self.info
        conditions = self.networks[planned.network] if o.link != "none" else None
        return configure.run_config(
            o, info, planned, warmed=self._warm_key(planned, configure.run_cuts(info, planned)) in self.warmed,
            timeout_s=configure.timeout_s(o, info, planned, configure.run_blocks(info, planned), conditions,
                                          self.compute_s))

    def cpu_traces(self, planned: PlannedRun) -> dict[str, str]:
        """The compute traces of a planned run: its network's, and ``--stage-cpu-trace``'s over them."""
        return {**dict(self.networks[planned.network].cpu_traces), **self.opts.stage_cpu_trace}

    def run_one(self, planned: PlannedRun, observed: dict | None) -> RunRecord:
        o = self.opts
        cfg = self.run_config(planned)
        conditions = self.networks[planned.network] if o.link == "emulated" else None
        budget = o.wait_time + cfg.timeout_s * (o.num_batches + o.warmup + 2) + \
            (cfg.loadgen.longest_s if cfg.loadgen is not None else 0.0)
        traced = self.cpu_traces(planned)
        extra: dict[str, Any] = {"cpu_traces": traced} if traced else {}
        if cfg.fault is not None and cfg.fault.target == "link" and self.link_down is not None:
            extra["link_down"] = self.link_down  # tc's link: the sweep takes it down when stage 1 asks
        record = self.group.run(cfg, conditions, observed, budget, **extra)
        if not isinstance(record, RunRecord):
            raise PeerError(f"{planned.backend}: the run returned no record")
        if record.status == INFEASIBLE:
            # A measured outcome; the run was cut short mid-exchange, so the stages start afresh.
            self.stop()
            return record
        if record.status != COMPLETE:
            raise PeerError(record.error or "run incomplete")
        if planned.prompt_len is not None:
            # A language model's stage process holds one plan's blocks at a time (LMBuilder.stage):
            # a plan it ran before, then left, is built again, so only the last plan is warm.
            self.warmed.clear()
        self.warmed.add(self._warm_key(planned, cfg.cuts))
        self.cipher_used = cipher_of(record.manifest)
        self.compute_s = max(self.compute_s, sum(v or 0.0 for v in record.summary.stages("compute_median_s")))
        return record

    @staticmethod
    def _warm_key(planned: PlannedRun, cuts: Sequence[str]) -> tuple:
        return planned.model, planned.backend, tuple(cuts), planned.engine

    # -- the sweep -----------------------------------------------------------------------------
    def run(self, keep_group: bool = False) -> SweepResult:
        """Measure every configuration of the options; ``keep_group``: leave the last worker group
        (and broker) running for the next :meth:`retarget` (a search's trials; :meth:`close` ends
        them), unless the sweep failed or was interrupted."""
        o = self.opts
        self.ledger.begin()
        opts = dataclasses.asdict(o)
        opts["testbed"] = o.testbed.describe()
        meta = self.ledger.load_meta(opts, {n: c.to_dict() for n, c in self.networks.items()})
        if not o.testbed.remote and self.group_factory is process_group:
            zygote.prestart(o.workload.preload)
        interrupted = ended = False
        total = 0
        failed: list[PlannedRun] = []
        try:
            for i, model in enumerate(o.models):
                for group in worker_groups(o):
                    self.opts = pass_options(o, group.placement)  # a placement's hosts and plans
                    self._begin_pass(model, group)
                    total += self._sweep_group(model, group.backend, meta, failed)
                if not keep_group or i + 1 < len(o.models):
                    self.stop()
            ended = True
        except KeyboardInterrupt:
            interrupted = True
            log.warning("interrupted: stopping the stages; finished runs stay valid, --resume completes the rest")
        finally:
            self.opts = o
            if not (keep_group and ended):
                self.close()
            meta.interrupted = interrupted
            try:
                self.ledger.consolidate(meta, final=True)
            except DiskFullError as exc:
                log.error("%s", exc)
        if interrupted:
            raise KeyboardInterrupt
        measured = meta.runs_complete + meta.runs_infeasible
        if o.report and measured:
            self._report()
        return SweepResult(self.dir, total, failed, measured)

    def _begin_pass(self, model: str, group: GroupPass) -> None:
        """Start the pass's processes, or keep the group's where it differs from the last pass only in
        a language model's prompt length, the fault or the wire dtype (its warm-up is paid again:
        the first run of each cut warms up)."""
        last, self.group_pass = self.group_pass, group
        same = dataclasses.replace(last, prompt_len=group.prompt_len, fault=group.fault,
                                   wire_dtype=group.wire_dtype) == group
        if same and self.group is not None and self.info is not None and self.info.model and self.group.alive() \
                and self._model == model:
            self.warmed.clear()
            return
        self.start(model, group.backend, group.cipher, group.transport)
        self._model = model

    def _sweep_group(self, model: str, backend: str, meta: SessionMeta,
                     failed: list[PlannedRun]) -> int:
        """Every configuration of one model and backend, in rounds (see :mod:`.rounds`)."""
        from tqdm import tqdm

        o = self.opts
        group = self._group_state(model, backend, meta)
        tc_mode = o.link == "tc"
        bar = tqdm(total=len(group.configs) * o.runs, desc=group.name.replace("/", " "), unit="run",
                   dynamic_ncols=True, disable=None)
        self._plan_progress(meta, len(group.configs) * o.runs)
        r = 0
        while True:
            active = [c for c in group.configs if group.progress[c].stopped is None]
            if not active:
                break
            for network, members in segments(round_plan(o, model, backend, group, active, r), tc_mode):
                with tc_applied(o, self.session, backend, self.networks[network], self.broker_address()) \
                        if network else contextlib.nullcontext(Shaped()) as shaped:
                    observed, self.link_down = shaped.observed, shaped.link
                    for one in members:
                        if group.progress[(one.network, one.split)].stopped is not None:
                            continue  # sequential mode: precise before its budget
                        self._measure(one, group, observed, failed)
                        bar.update(1)
                        drifted = drift_check(self, group.drift, group.reference, network or group.reference[0],
                                              observed, model, backend, group.meta)
                        requeue_drifted(self, drifted, group, model, backend)
                        group.meta.drift_checks = [dataclasses.asdict(c) for c in group.drift.checks]  # live: the page's alerts
                        if time.monotonic() - self.ledger.consolidated >= CONSOLIDATE_EVERY_S:
                            self.ledger.consolidate(meta, final=False)
            r += 1
            for c in active:
                if group.progress[c].stopped is None and not group.rerun[c]:
                    group.progress[c].stopped = group.progress[c].decide(o.runs, o.precision, group.max_runs)
            bar.total = max(bar.total, bar.n + sum(1 for c in group.configs if group.progress[c].stopped is None))
        bar.close()
        group.meta.stopping = {PlannedRun(model, backend, n, k, 0, cipher=self.cipher, transport=self.transport,
                                          **settings_of(o, self.group_pass)).config_key: p.describe()
                               for (n, k), p in group.progress.items()}
        group.meta.drift_checks = [dataclasses.asdict(c) for c in group.drift.checks]
        # Keyed as summary.csv keys a configuration: by the cipher its runs used, and what its runs
        # recorded of their batches and window (a generation's: one token of each of its streams).
        batch, window = o.workload.batch_of(o), o.workload.window_of(o)
        self.ledger.stopping.update({ConfigKey(self.info.model, backend, self.cipher_used or group.cipher, group.transport, n,
                                        batch, k.label, settings_of(o, self.group_pass)["codec"], window, self.scenario,
                                        self.group_pass.prompt_len or NO_PROMPT, self.group_pass.fault,
                                        self.group_pass.placement or NO_PLACEMENT): p.describe()
                              for (n, k), p in group.progress.items()})
        return len(group.configs)

    def _plan_progress(self, meta: SessionMeta, group_runs: int) -> None:
        """session.json's ``progress`` at a group's start, written at once for a live page: runs
        planned in the groups started so far, and the groups to come estimated as this one (their
        models may have other splits: ``estimated`` says so until the last group starts)."""
        o = self.opts
        groups = len(o.models) * len(worker_groups(o))
        started = (meta.progress or {}).get("groups_started", 0) + 1
        planned = (meta.progress or {}).get("planned_started", 0) + group_runs
        meta.progress = {"groups": groups, "groups_started": started, "planned_started": planned,
                         "planned_runs": planned + group_runs * max(0, groups - started),
                         "estimated": started < groups}
        self.ledger.write_meta(meta)

    def _group_state(self, model: str, backend: str, meta: SessionMeta) -> GroupProgress:
        """A group's configurations, their progress, the drift reference and the session's record of it."""
        o = self.opts
        splits = splits_for(o, self.info.num_blocks, self.info.fine_cuts)
        configs = [(n, k) for n in o.networks for k in splits]
        max_runs = o.max_runs or (3 * o.runs if o.precision else o.runs)
        static = [k for k in splits if not k.adaptive] or splits
        reference = (o.networks[0], static[len(static) // 2])
        name = self.group_pass.name(model)
        group_meta = meta.group(name, order=o.order, seed=o.seed, precision=o.precision, min_runs=o.runs,
                                max_runs=max_runs, reference={"network": reference[0], "split": reference[1].label})
        # A LoadGen run is minutes long and its own figures carry their validity: no drift checks.
        # A fault run's latencies are the fault's: no drift checks either.
        drift_every = o.drift_every_s if o.order == "random" and self.scenario == CLOSED_LOOP and \
            self.group_pass.fault == NO_FAULT else 0.0
        return GroupProgress(name, self.cipher, self.transport, configs, {c: rounds.ConfigProgress() for c in configs}, max_runs,
                             rounds.DriftMonitor(drift_every), reference, group_meta, {c: [] for c in configs},
                             group_pass=self.group_pass)

    def _measure(self, one: PlannedRun, group: GroupProgress, observed: Any, failed: list[PlannedRun]) -> None:
        """One planned run (or its record from the run being resumed), counted in its configuration."""
        o = self.opts
        cfg = (one.network, one.split)
        progress = group.progress[cfg]
        record = self.ledger.resumed(one.run_key, self.opts.resume) or self.attempt(one, observed, one.model, one.backend)
        progress.attempts += 1
        group.meta.executed.append(one.run_key)
        if record is None:
            failed.append(one)
        elif record.status == INFEASIBLE:
            # Measuring it again cannot make it meet the user's deadline.
            progress.stopped = INFEASIBLE
            log.warning("%s is infeasible: %s", one.run_key, record.error)
        else:
            progress.add(record.summary)
            group.drift.since.append((cfg, one.run, one.run_key))
        if o.order == "sequential" and progress.stopped is None:
            progress.stopped = progress.decide(o.runs, o.precision, group.max_runs)

    def attempt(self, planned: PlannedRun, observed: dict | None, model: str, backend: str) -> RunRecord | None:
        """Run ``planned`` and write its record; a failure is recorded and tried once more on fresh
        processes. Returns the record, or None when both attempts failed."""
        for attempt in (1, 2):
            try:
                if self.group is None or not self.group.alive():
                    self.start(model, backend, planned.cipher, planned.transport)
                record = self.run_one(planned, observed)
                self.ledger.keep(planned, record)
                return record
            except DiskFullError:
                raise
            except (ParetoPipeError, OSError) as exc:
                self.ledger.failed(planned.run_key, attempt, str(exc))
                log.warning("%s attempt %d failed: %s", planned.run_key, attempt, exc)
                # A half-finished exchange leaves the processes in an unknown state: start them afresh.
                self.stop()
                try:
                    self.start(model, backend, planned.cipher, planned.transport)
                except ParetoPipeError as exc2:
                    self.ledger.failed(planned.run_key, attempt, f"restart failed: {exc2}")
                    if attempt == 2:
                        raise
        return None

    def _report(self) -> None:
        # lazy for start-up: pandas and matplotlib load only when a sweep ends with its report
        from ...analysis import report

        report.write_report(self.dir, self.dir / "report", objectives=self.opts.objectives)
