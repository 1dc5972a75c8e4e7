"""A study shared by several workers (``--study URL``): real worker processes (study_worker.py)
join one study in a journal file or in a real PostgreSQL server, the budget holds for the whole
study, nothing is measured twice, a worker killed in the middle of a measurement has that
configuration measured by another, and a study of another search is refused in one line."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT
from paretopipe.errors import UsageError
from paretopipe.search import loop, study
from postgres_server import postgres
from study_worker import SPACE

WORKER = Path(__file__).with_name("study_worker.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _worker(url: str, testbed: str, budget: int, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(WORKER), "--study", url, "--testbed", testbed, "--budget", str(budget),
                             "--log", str(log), *extra], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _lines(log: Path, kind: str) -> list[tuple[str, str]]:
    """(testbed, configuration) of each ``kind`` line of the workers' log."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        word, testbed, split, network = line.split()
        if word == kind:
            out.append((testbed, f"{split} {network}"))
    return out


def _wait_for(log: Path, kind: str, testbed: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [c for t, c in _lines(log, kind) if t == testbed]
        if got:
            return got[0]
        time.sleep(0.1)
    raise AssertionError(f"worker {testbed} never logged {kind}")


def test_two_workers_of_a_journal_study_share_its_budget_and_measure_nothing_twice(tmp_path):
    url, log = f"journal:{tmp_path / 'study.journal'}", tmp_path / "log"
    workers = [_worker(url, name, 12, log) for name in ("bench-a", "bench-b")]
    outs = [w.communicate(timeout=180) for w in workers]
    assert all(w.returncode == 0 for w in workers), outs
    done = _lines(log, "done")
    configs = [c for _, c in done]
    assert len(configs) == 12 and len(set(configs)) == 12          # the study's budget, each once
    by_testbed = collections.Counter(t for t, _ in done)
    assert set(by_testbed) == {"bench-a", "bench-b"}               # both testbeds measured
    assert all("study 12" in out for out, _ in outs)
    # The study holds 12 measured configurations with the testbed that measured each.
    import optuna

    s = optuna.load_study(study_name="toy", storage=study.open_storage(url))
    state = loop.StudyState.of(s, SPACE)
    assert len(state.measured) == 12 and not state.claimed
    testbeds = collections.Counter(t.user_attrs[loop.TESTBED] for t in s.trials if t.user_attrs.get(loop.MEASURED))
    assert testbeds == by_testbed


def test_a_worker_killed_mid_measurement_has_its_configuration_finished_by_another(tmp_path):
    url, log = f"journal:{tmp_path / 'study.journal'}", tmp_path / "log"
    doomed = _worker(url, "bench-a", 8, log, "--hang-first")
    hung = _wait_for(log, "start", "bench-a")
    survivor = _worker(url, "bench-b", 8, log)
    time.sleep(1.0)   # the survivor has joined and sees bench-a's configuration as being measured
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=30)
    out, err = survivor.communicate(timeout=180)
    assert survivor.returncode == 0, err
    done = _lines(log, "done")
    assert [t for t, c in done if c == hung] == ["bench-b"]      # finished elsewhere, once
    assert len(done) == 8 and len({c for _, c in done}) == 8     # the budget, nothing twice, nothing lost
    assert "retry" in out.split("origins ")[1]
    assert "died measuring trial" in err


def test_over_postgresql_a_worker_that_stops_beating_has_its_configuration_retried(tmp_path):
    """A real PostgreSQL server; the killed worker's trial is found stale by its heartbeat (1 s,
    grace 3 s) and queued again by Optuna's retry callback."""
    with postgres(tmp_path) as (url, password):
        log = tmp_path / "log"
        doomed = _worker(url, "bench-a", 8, log, "--hang-first", "--grace-s", "3")
        hung = _wait_for(log, "start", "bench-a")
        survivor = _worker(url, "bench-b", 8, log, "--grace-s", "3")
        time.sleep(1.0)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        out, err = survivor.communicate(timeout=180)
        assert survivor.returncode == 0, err
        done = _lines(log, "done")
        assert [t for t, c in done if c == hung] == ["bench-b"]
        assert len(done) == 8 and len({c for _, c in done}) == 8
        assert "retry" in out.split("origins ")[1]
        assert password not in out + err
        # A wrong password is one line naming the URL without the password.
        bad = url.replace(password, "wrong-password")
        proc = _worker(bad, "bench-c", 2, log)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and err.count("\n") == 1
        assert "cannot open the study's database" in err and "wrong-password" not in err and ":***@" in err


def test_a_study_made_by_another_search_is_refused_in_one_line(tmp_path):
    url, log = f"journal:{tmp_path / 'study.journal'}", tmp_path / "log"
    first = _worker(url, "bench-a", 2, log, "--seconds", "0")
    assert first.wait(timeout=120) == 0
    for extra, what in ((["--model", "resnet50"], "model toy (this search: resnet50)"),
                        (["--objectives", "latency:min"], "has 2 objectives"),
                        (["--objectives", "latency:min,energy:max"], "objectives latency (min),throughput (max)")):
        proc = _worker(url, "bench-b", 2, log, *extra)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and err.count("\n") == 1, err
        assert what in err and "--study-name" in err


@pytest.mark.parametrize("url, what", [
    ("redis://127.0.0.1/0", "unknown storage 'redis'; give journal:PATH"),
    ("journal:/nonexistent-folder/s.journal", "folder /nonexistent-folder does not exist"),
])
def test_a_study_url_that_names_no_storage_is_refused(url, what):
    with pytest.raises(UsageError, match=what.replace("(", r"\(").replace(")", r"\)")):
        study.check_url(url)


def test_an_unreachable_database_is_one_line_and_the_password_never_shows():
    import socket

    with socket.socket() as s:   # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UsageError) as err:
        study.open_storage(f"postgresql://u:secret-pw@127.0.0.1:{port}/db")
    text = str(err.value)
    assert "cannot open the study's database" in text and "secret-pw" not in text and "\n" not in text
    assert study.redacted("postgresql://u:pw@h:5/d") == "postgresql://u:***@h:5/d"
    assert study.redacted("postgresql://u@h/d") == "postgresql://u@h/d"



def test_workers_opening_a_new_postgresql_study_at_once_all_get_it(tmp_path):
    """Eight processes open the same new database at one instant: each creates Optuna's tables,
    PostgreSQL lets one CREATE win and refuses the rest (a unique violation in pg_type; a lab
    test's second worker exited 2 on it), and every opener must still get the study."""
    with postgres(tmp_path) as (url, _password):
        # Each opener says it is ready once imported, then blocks on its stdin: the parent's word
        # reaches all eight within microseconds, where polling a file cost a core's CPU between them.
        script = ("import sys\nfrom paretopipe.search.study import open_storage\n"
                  "print('ready', flush=True)\nsys.stdin.readline()\n"
                  "open_storage(sys.argv[1])\nprint('opened')\n")
        procs = [subprocess.Popen([PYTHON, "-c", script, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(8)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 8
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 8, [err[-500:] for _, err in results if err]
        assert all(out.strip() == "opened" for out, _ in results)
