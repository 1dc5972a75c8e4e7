"""Drift checks while a group runs: the reference configuration is re-measured every
--drift-every-s (:class:`paretopipe.controller.sweep.rounds.DriftMonitor` decides), and when its speed
moved, the runs measured since the last check are set aside and planned again."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ...analysis.session import GroupMeta, Session
from ... import records
from ...records import COMPLETE, INFEASIBLE
from ...runrecord import RunRecord, RunSummary
from . import rounds
from .ledger import SweepLedger
from .group import GroupPass, GroupProgress
from .options import SweepOptions
from .plan import PlannedRun, settings_of

log = logging.getLogger("paretopipe.sweep")


class Measurer(Protocol):
    """What the drift checks use of the sweeper: its options, ledger (its clock; a reference run's
    time is added to its ``reference_s``), session, the current group's cipher, and how it
    measures one run."""

    opts: SweepOptions
    ledger: SweepLedger
    session: Session
    cipher: str
    transport: str
    group_pass: GroupPass

    def attempt(self, planned: PlannedRun, observed: dict | None, model: str, backend: str) -> RunRecord | None: ...


def drift_check(sweeper: Measurer, drift: rounds.DriftMonitor, reference: tuple, network: str,
                observed: dict | None, model: str, backend: str, group_meta: GroupMeta) -> list:
    """Measure the reference when due; returns the runs to measure again after a drift."""
    now = time.monotonic() - sweeper.ledger.started
    if not (drift.needs_baseline(network) or drift.due(now)):
        return []
    ref_network = network if sweeper.opts.link == "tc" else reference[0]
    baseline = drift.needs_baseline(ref_network)
    summaries = reference_runs(sweeper, drift.BASELINE_RUNS if baseline else 1, ref_network, reference,
                                     observed, model, backend, group_meta)
    if summaries is None:
        log.warning("the drift reference %s k=%s is infeasible under --max-batch-s: no drift checks for %s %s",
                    ref_network, reference[1].label, model, backend)
        drift.every_s = 0.0
        return []
    if summaries and not baseline and drift.suspect(ref_network, summaries[0]):
        # One run lands on one moment of the machine; before the sweep measures runs again, two
        # more runs confirm that the reference's speed moved (their median is the check).
        more = reference_runs(sweeper, drift.CONFIRM_RUNS - 1, ref_network, reference, observed, model,
                                    backend, group_meta)
        summaries = summaries + more if more else []  # None (infeasible now) counts as a failure
    if not summaries:
        return []
    now = time.monotonic() - sweeper.ledger.started
    if baseline:
        drift.set_baseline(ref_network, summaries, now)
        return []
    items = list(drift.since)
    check = drift.check(ref_network, summaries, now)
    if not check.drift:
        return []
    log.warning("drift: the reference %s k=%s changed throughput by %.0f%% (threshold %.0f%%); measuring the %d "
                "runs since the last check again", ref_network, reference[1].label, 100 * check.change,
                100 * check.threshold, len(items))
    return items


def reference_runs(sweeper: Measurer, count: int, network: str, reference: tuple, observed: dict | None,
                   model: str, backend: str, group_meta: GroupMeta) -> list[RunSummary] | None:
    """``count`` runs of the reference configuration, kept apart from the sweep's; their
    summaries, none when one fails, or None when one is infeasible."""
    summaries: list[RunSummary] = []
    for _ in range(count):
        n = len(group_meta.reference_runs)
        planned = PlannedRun(model, backend, network, reference[1], n, reference=True, cipher=sweeper.cipher,
                             transport=sweeper.transport, **settings_of(sweeper.opts, sweeper.group_pass))
        record = sweeper.attempt(planned, observed, model, backend)
        if record is None:
            return []
        if record.status == INFEASIBLE:
            return None
        group_meta.reference_runs.append(planned.run_key)
        sweeper.ledger.reference_s += record.summary.measuring_s
        summaries.append(record.summary)
    return summaries


def requeue_drifted(sweeper: Measurer, drifted: list[tuple], group: GroupProgress, model: str, backend: str) -> None:
    """Set aside the runs measured while the machine drifted and plan them again. Each run is
    measured again at most once, and each configuration at most max_runs times: a machine that
    stays slow is the new normal, not drift."""
    for (dcfg, run, key) in drifted:
        if key in group.rerun_done or dcfg not in group.progress or \
                group.progress[dcfg].remeasured >= group.max_runs:
            continue
        group.rerun_done.add(key)
        sweeper.session.set_aside(key)
        prog = group.progress[dcfg]
        prog.remeasured += 1
        prog.latencies, prog.throughputs = values_of(sweeper, model, backend, dcfg)
        prog.attempts -= 1
        prog.stopped = None
        group.rerun[dcfg].append(run)


def values_of(sweeper: Measurer, model: str, backend: str, cfg: tuple) -> tuple[list[float], list[float]]:
    """The latencies and throughputs of a configuration's complete runs on disk (those kept)."""
    key = PlannedRun(model, backend, cfg[0], cfg[1], 0, cipher=sweeper.cipher, transport=sweeper.transport,
                     **settings_of(sweeper.opts, sweeper.group_pass)).config_key
    lat, thr = [], []
    for path in sorted(sweeper.session.runs_dir.glob(f"{key}_r*.json")):
        rec = sweeper.session.read_run(path)
        if rec and rec["status"] == COMPLETE and rec["config"].get("config_key") == key:
            lat.append(rec["summary"].get("latency_median_s"))
            thr.append(records.throughput_of(rec["summary"]))
    return lat, thr
