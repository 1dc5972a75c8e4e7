"""The data source's per-batch schedule: the window really blocks, stamps, repeats, timeouts, the
user's per-batch deadline, and how an error becomes the record's status."""

from __future__ import annotations

import threading
import time

import pytest

from paretopipe.errors import InfeasibleRun, PeerError, WireError
from paretopipe.transport.runconfig import RunConfig
from paretopipe.transport.bookkeeping import BatchBook, status_of


def _cfg(**kw):
    return RunConfig(model="mobilenet_v2", cuts=["features_8"], **kw)


def test_the_window_blocks_the_source_until_a_result_frees_a_slot():
    sched = BatchBook(_cfg(num_batches=3, warmup=0, in_flight=2, timeout_s=30))
    for seq in range(2):
        sched.acquire(lambda: None)
        sched.start(seq)
    third = threading.Event()

    def source():
        sched.acquire(lambda: None)
        third.set()

    thread = threading.Thread(target=source, daemon=True)
    thread.start()
    # Two batches are in flight: the third waits, however long it is given.
    assert not third.wait(0.3)
    sched.complete(0, time.monotonic())
    assert third.wait(10)  # a completion frees exactly the slot it needs
    thread.join(10)


def test_stamps_and_repeats():
    sched = BatchBook(_cfg(num_batches=2, warmup=1, in_flight=2, timeout_s=1))
    for seq in range(2):
        sched.acquire(lambda: None)
        sched.start(seq)
    rec = sched.complete(0, sched.t0 + 0.5)
    assert rec["warmup"] and rec["latency_s"] == pytest.approx(0.5 - rec["start_s"])
    with pytest.raises(WireError, match="unknown or repeated batch 0"):
        sched.complete(0, sched.t0 + 0.6)
    with pytest.raises(WireError, match="unknown or repeated batch 7"):
        sched.complete(7, sched.t0 + 0.6)
    assert [r["seq"] for r in sched.records()] == [0, 1] and not sched.finished.is_set()


def test_a_full_window_that_never_frees_times_out_and_check_runs_while_waiting():
    sched = BatchBook(_cfg(num_batches=2, warmup=0, in_flight=1, timeout_s=0.3))
    sched.acquire(lambda: None)
    sched.start(0)
    checks = []
    with pytest.raises(PeerError, match="no result from the pipeline for 0.3s"):
        sched.acquire(lambda: checks.append(1))
    assert len(checks) >= 2  # the peer's health was checked while waiting


def test_a_batch_past_max_batch_s_ends_the_run_as_infeasible():
    late = BatchBook(_cfg(num_batches=2, warmup=0, in_flight=2, max_batch_s=0.2))
    late.acquire(lambda: None)
    late.start(0)
    late.complete(0, late._starts[0] + 0.5)  # completed, but after 0.5 s
    with pytest.raises(InfeasibleRun, match=r"batch 0 took 0.5 s, more than --max-batch-s 0.2"):
        late.check_deadline()
    stuck = BatchBook(_cfg(num_batches=2, warmup=0, in_flight=1, max_batch_s=0.2, timeout_s=30))
    stuck.acquire(lambda: None)
    stuck.start(0)
    stuck.check_deadline()  # young: fine
    with pytest.raises(InfeasibleRun, match="batch 0 was still in the pipeline after --max-batch-s 0.2"):
        stuck.acquire(lambda: None)  # the window is full and its batch is overdue: not the 30 s timeout
    assert status_of(InfeasibleRun("batch 0 took 9 s"))[0] == "infeasible"


def test_status_of():
    assert status_of(None) == ("complete", None)
    assert status_of(KeyboardInterrupt()) == ("incomplete", "interrupted (Ctrl-C or a termination signal)")
    assert status_of(OSError("boom\nsecond line")) == ("incomplete", "boom")


def test_progress_is_reported_at_the_first_measured_batch_then_at_most_every_10_s(caplog):
    sched = BatchBook(_cfg(num_batches=5, warmup=1, in_flight=6, timeout_s=30))
    for seq in range(6):
        sched.start(seq)
    t0 = sched.t0
    with caplog.at_level("INFO", logger="paretopipe.bookkeeping"):
        sched.complete(0, t0 + 1.0)   # warm-up: nothing measured yet
        sched.complete(1, t0 + 2.0)   # the first measured batch
        sched.complete(2, t0 + 5.0)   # within 10 s of the last line
        sched.complete(3, t0 + 12.5)  # 10.5 s later
        sched.complete(4, t0 + 30.0)  # more than 10 s later
        sched.complete(5, t0 + 45.0)  # the last batch: the run's own summary says the rest
    assert [r.getMessage() for r in caplog.records] == [
        "1 of 5 batches measured after 2 s", "3 of 5 batches measured after 12 s", "4 of 5 batches measured after 30 s"]
