"""Faults as a sweep's treatment, end to end with real processes: stage 2 killed (SIGKILL) and
started again, frozen (SIGSTOP, SIGCONT), and the link down; every batch is served once, the
figures say when the fault was seen and when the split was whole again, and the report ranks the
splits by what the outage cost. A link that is down returns every batch equal to the unsplit
model's, those stage 1 served itself included."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import PYTHON
import tcp_helpers as cli
from paretopipe import faults

FAULTS = "none,stage2:kill@20+2,stage2:freeze@20+2,link:down@20+2"  # longer than the 1 s deadline


def _batches_served_once(rec: dict) -> None:
    """Every measured batch the run was to serve (more after a fault), each ended exactly once."""
    measured = [b for b in rec["batches"] if not b["warmup"]]
    seqs = [b["seq"] for b in measured]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and len(seqs) >= rec["config"]["num_batches"]
    assert all("end_s" in b and b["latency_s"] > 0 for b in measured)
    assert all(b.get("local_compute_s", 0) > 0 for b in measured if b.get("served_locally"))


@pytest.mark.slow
def test_a_sweep_measures_a_kill_a_freeze_and_a_link_down_and_ranks_the_splits_by_their_cost(tmp_path):
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4,14",
                    "--fault", FAULTS, "--batch-size", "1", "--num-batches", "40", "--runs", "1", "--local",
                    "--out", str(tmp_path / "out"), "--session", "s", "--quiet"], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    runs["fault"] = runs["fault"].fillna("none")  # a run without a fault leaves the column empty
    assert len(runs) == 8 and set(runs["status"]) == {"complete"}
    assert set(runs["fault"]) == set(FAULTS.split(","))
    for row in runs.itertuples():
        rec = json.loads((session / row.json).read_text())
        _batches_served_once(rec)
        assert rec["config"]["deadline_s"] == 1.0  # a fault sweep's default deadline
        if row.fault == "none":
            assert "fault_lost" not in rec["summary"]
            continue
        s = rec["summary"]
        assert s["fault"] == row.fault and s["fault_lost"] == 0 and s["fault_duplicated"] == 0
        fault = faults.parse_fault(row.fault)
        events = [e["event"] for e in rec["manifest"]["stages"][0]["fallback"]["events"]]
        if fault.kind == "kill":
            # Seen at once (the connection resets), served here until a new stage 2 is back: it
            # starts S seconds after the kill and builds its model first.
            assert s["fault_detect_s"] < 1.0 and s["fault_served_locally"] >= 1  # before the deadline
            assert fault.seconds <= s["fault_recover_s"] < fault.seconds + 120
            assert events[:2] == ["fault", "peer_lost"] and "reconnected" in events
        else:
            # Silence: seen when the deadline passes; whole again once the S seconds are over.
            assert 1.0 <= s["fault_detect_s"] < 1.0 + 2.0 and s["fault_served_locally"] >= 1
            assert fault.seconds <= s["fault_recover_s"] < fault.seconds + 10.0
            assert s["fault_window_p99_s"] >= 1.0 and "peer_lost" not in events
    summary = pd.read_csv(session / "summary.csv")
    assert len(summary) == 8 and set(summary["fault"]) == set(FAULTS.split(","))
    table = pd.read_csv(session / "report" / "robustness.csv")
    assert len(table) == 6 and set(table["split_index"]) == {4, 14}
    for _, ranked in table.groupby("fault"):
        assert sorted(ranked["cost_rank"]) == [1, 2]
        assert list(ranked["fault_cost_s"]) == sorted(ranked["fault_cost_s"])
    assert "Robustness: what each split" in (session / "report" / "report.html").read_text()


@pytest.mark.slow
def test_a_chains_middle_stage_killed_and_frozen_and_the_chain_whole_again(tmp_path):
    """Three stages: the middle one is stage 2. Killed, a new one is started, connects to stage 1
    and stage 3 connects to it; frozen, it catches up; every batch served once either way."""
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--split-blocks", "4,14",
                    "--fault", "none,stage2:kill@10+2,stage2:freeze@10+2", "--batch-size", "1", "--num-batches",
                    "30", "--runs", "1", "--local", "--out", str(tmp_path / "out"), "--session", "s", "--quiet",
                    "--no-report"], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    assert len(runs) == 3 and set(runs["status"]) == {"complete"}
    assert pd.read_csv(session / "failures.csv").empty  # the chain after the kill served the next pass too
    for path in runs["json"]:
        rec = json.loads((session / path).read_text())
        _batches_served_once(rec)
        s = rec["summary"]
        if "fault" not in s:
            continue
        assert s["fault_lost"] == 0 and s["fault_duplicated"] == 0 and s["fault_recover_s"] >= 2.0
        last = rec["batches"][-1]
        assert not last.get("served_locally") and len(last["hop_bytes"]) == 3  # through all three again


@pytest.mark.slow
def test_a_link_down_returns_every_batch_equal_to_the_unsplit_model(tmp_path):
    s1, _ = cli.run_in_threads("mobilenetv2", 6, tmp_path, batch_size=1, num_batches=30, warmup=0,
                               deadline_s=0.3, fault=faults.parse_fault("link:down@10+0.8"))
    s = s1.record["summary"]
    assert s["fault_lost"] == 0 and s["fault_served_locally"] >= 2 and s["fault_recover_s"] >= 0.8
    reference = cli.reference_outputs("mobilenetv2", 1, len(s1.outputs))
    assert len(s1.outputs) == 30 + s["fault_extra_batches"]
    for got, want in zip(s1.outputs, reference):
        assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("extra, says", [
    (["--backend", "rpc"], "rpc backend cannot yet recover"),
    (["--split-blocks", "4,10,14"], "chain of three stages"),
    (["--in-flight", "2"], "--in-flight 2"),
    (["--num-batches", "10"], "batch 20 is past the run's 10 measured batches"),
])
def test_a_fault_the_sweep_cannot_survive_is_refused_in_one_line(tmp_path, extra, says):
    done = cli.run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4",
                    "--fault", "stage2:kill@20+2", "--local", "--dry-run", "--out", str(tmp_path), *extra],
                   timeout=300)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.lab
def test_faults_on_a_two_host_lab_over_ssh_kill_and_freeze_the_remote_stage_2_and_take_the_link_down(tmp_path):
    """The same treatment on hosts: the sweep signals stage 2's worker on its host over SSH by the
    PID it reported (the data port shaped by tc there, rate only), and starts a new one there; it
    takes the link down by the hosts' own qdiscs (a queue of no room on each egress), which stage 1
    lives through as through a frozen stage 2 (nothing here holds its frames)."""
    from lab_helpers import lab

    nets = tmp_path / "nets.toml"
    nets.write_text('[slow]\nrate = "20mbit"\ncomment = "rate only: htb shapes it on any kernel"\n')
    with lab("pplf", 2, subnet=67) as made:
        done = cli.run([PYTHON, "automated_split_tester.py", "--env-file", str(made.env_file), "--model",
                        "mobilenetv2", "--network-file", str(nets), "--network", "slow", "--splits", "4",
                        "--fault", "stage2:kill@10+2,stage2:freeze@10+2,link:down@10+2", "--runs", "1",
                        "--batch-size", "1", "--num-batches", "30", "--threads", "1", "--out", str(tmp_path / "out"),
                        "--session", "s", "--quiet"], timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    session = tmp_path / "out" / "s"
    runs = pd.read_csv(session / "runs.csv")
    # No fault-free row: a lab sweep without faults is every other lab test's, and the local fault
    # sweep above ranks each fault against one.
    assert len(runs) == 3 and set(runs["status"]) == {"complete"} and set(runs["link_mode"]) == {"tc"}
    for row in runs.itertuples():
        rec = json.loads((session / row.json).read_text())
        _batches_served_once(rec)
        s = rec["summary"]
        assert s["fault_lost"] == 0 and s["fault_duplicated"] == 0 and s["fault_served_locally"] >= 1
        assert 2.0 <= s["fault_recover_s"]
        if row.fault.startswith("stage2:kill"):
            assert s["fault_detect_s"] < 1.0
            assert "reconnected" in [e["event"] for e in rec["manifest"]["stages"][0]["fallback"]["events"]]
        else:
            assert s["fault_detect_s"] >= 1.0
