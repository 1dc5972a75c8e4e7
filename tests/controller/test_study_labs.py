"""One search study, two testbeds: a real PostgreSQL server and two namespace labs (each two hosts
with their own sshd, each its own .env), a ``paretopipe search --study postgresql://...`` worker per
lab; one worker is killed in the middle of a configuration, and the other, after the dead one's
heartbeat goes stale, measures it. Nothing is measured twice and nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import PYTHON
import tcp_helpers as cli
from lab_helpers import lab
from postgres_server import postgres

BUDGET = 4


def _worker(made, url: str, testbed: str, tmp: Path):
    return cli.popen([PYTHON, "-m", "paretopipe", "search", "--env-file", str(made.env_file), "--model", "mobilenetv2",
                      "--splits", "0,6,12,19", "--network", "lan", "--budget", str(BUDGET), "--runs", "1",
                      "--batch-size", "1", "--num-batches", "6", "--warmup", "1", "--threads", "1", "--drift-every", "0",
                      "--study", url, "--study-grace-s", "6", "--testbed", testbed, "--out", str(tmp),
                      "--session", testbed, "--no-report"])


def _running(url: str, testbed: str) -> list:
    import optuna
    from optuna.trial import TrialState

    from paretopipe.search import study

    try:
        s = optuna.load_study(study_name="paretopipe-mobilenet_v2", storage=study.open_storage(url))
    except KeyError:   # not made yet
        return []
    return [t for t in s.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get("testbed") == testbed]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.lab
def test_two_lab_testbeds_share_a_postgresql_study_and_a_killed_workers_configuration_is_finished(tmp_path):
    with postgres(tmp_path) as (url, password), lab("pplsa", 2, subnet=63) as bench_a, \
            lab("pplsb", 2, subnet=64) as bench_b:
        procs = [_worker(bench_a, url, "bench-a", tmp_path)]
        try:
            _check(url, password, bench_b, procs, tmp_path)
        finally:   # the labs must be left empty, whatever failed
            for proc in procs:
                if proc.poll() is None:
                    cli.kill_group(proc)


def _check(url: str, password: str, bench_b, procs: list, tmp_path: Path) -> None:
    """bench-a's worker (``procs[0]``) killed mid-configuration; bench-b's (added to ``procs``) finishes the study."""
    doomed = procs[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _running(url, "bench-a"):
        assert doomed.poll() is None, doomed.communicate()[1][-2000:]
        time.sleep(0.5)
    survivor = _worker(bench_b, url, "bench-b", tmp_path)
    procs.append(survivor)
    time.sleep(2)
    # A configuration of 6 batches takes about a second once its stages are up: the one bench-a was
    # measuring when bench-b started may be done by now (in a rehearsal of .ci/run it was), so it
    # is killed only while the study shows it measuring one, and the configuration it died in is
    # the one still running there.
    while _running(url, "bench-a") == []:
        assert doomed.poll() is None, doomed.communicate()[1][-2000:]
        time.sleep(0.05)
    os.killpg(doomed.pid, signal.SIGKILL)   # the worker and its sweep's local processes
    doomed.wait(timeout=30)
    (hung,) = _running(url, "bench-a")   # it stays running in the study: its worker died in it
    out, err = survivor.communicate(timeout=900)
    assert survivor.returncode == 0, err[-3000:]
    assert password not in out + err
    docs = {}
    for name in ("bench-a", "bench-b"):
        path = tmp_path / name / "search.json"
        docs[name] = json.loads(path.read_text()) if path.exists() else {"trials": []}
    measured = [(name, t["config"]["split"], t["origin"]) for name, d in docs.items() for t in d["trials"]
                if t["origin"] != "reference" and t["status"] == "complete"]
    splits = [s for _, s, _ in measured]
    assert sorted(splits) == sorted(set(splits)) and len(splits) == BUDGET   # each once, none lost
    # The configuration bench-a died measuring was measured on bench-b, as a retry.
    split_of_hung = [0, 6, 12, 19][hung.params["split"]]
    assert ("bench-b", split_of_hung, "retry") in measured
    assert "configurations measured by all its workers" in out and f"{BUDGET} configurations" in out
    ref = docs["bench-b"]["reference"]
    assert set(ref["testbeds"]) == {"bench-a", "bench-b"} and ref["offsets"]["bench-b"]["latency"] > 0
