"""The anchor's runner flags do what its README says: --enable-prefetch / --prefetch-batches,
--use-intelligent-splitting / --disable-intelligent-splitting, and its documented defaults; and its
workflow of hand-run JSON files analysed by ``paretopipe report``."""

from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pytest
import torch

from conftest import PYTHON
from paretopipe.cli import common, rpc, stages, sweep
from paretopipe.errors import UsageError
from paretopipe.transport import inputs
from tcp_helpers import free_port, run, start


def _slow_source(count: int, delay_s: float, fail_at: int | None = None):
    for i in range(count):
        if i == fail_at:
            raise UsageError(f"batch {i} is unreadable")
        time.sleep(delay_s)
        yield torch.full((1,), float(i))


def test_prefetcher_prepares_batches_ahead_in_order():
    it = inputs.Prefetcher(_slow_source(6, 0.05), depth=3)
    time.sleep(0.4)  # the thread fills the queue meanwhile
    started = time.monotonic()
    first = [next(it) for _ in range(3)]
    assert time.monotonic() - started < 0.04  # three batches were ready, none made on demand
    rest = list(it)
    assert [int(t.item()) for t in first + rest] == [0, 1, 2, 3, 4, 5]
    it.close()


def test_prefetcher_raises_the_sources_error_at_its_batch_and_close_stops_it():
    it = inputs.Prefetcher(_slow_source(5, 0.0, fail_at=2), depth=2)
    assert [int(next(it).item()) for _ in range(2)] == [0, 1]
    with pytest.raises(UsageError, match="batch 2 is unreadable"):
        next(it)
    endless = inputs.Prefetcher(_slow_source(10**9, 0.0), depth=2)
    endless.close()
    assert not endless._thread.is_alive()
    assert not any(t.name == "prefetch" and t.is_alive() for t in threading.enumerate() if t is endless._thread)


@pytest.mark.parametrize("argv,depth", [([], 0), (["--enable-prefetch"], 2), (["--prefetch-batches", "5"], 5),
                                        (["--enable-prefetch", "--prefetch-batches", "0"], 0)])
def test_prefetch_flags_on_every_runner(argv, depth):
    for parser in (rpc.parser(), stages.stage1_parser(), sweep.parser()):
        assert common.prefetch_from_args(parser.parse_args(argv)) == depth


def test_num_threads_help_says_why_it_differs_from_the_anchor():
    text = rpc.parser().format_help()
    assert "anchor's default is 4" in " ".join(text.split())


def _runner(tmp_path, *extra: str) -> dict:
    out = tmp_path / "metrics"
    proc = run([PYTHON, "distributed_runner.py", "--local", "--world-size", "2", "--rpc-source", "stage1",
                "--model", "resnet18", "--batch-size", "2", "--num-test-samples", "4", "--warmup", "1",
                "--network", "lte", "--threads", "1", "--metrics-dir", str(out), *extra], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.glob("*.json")
    return {"record": json.loads(path.read_text()), "stdout": proc.stdout}


@pytest.mark.slow
def test_intelligent_splitting_chooses_from_the_cost_model_and_records_its_prediction(tmp_path):
    run = _runner(tmp_path, "--use-intelligent-splitting", "--enable-prefetch")
    rec = run["record"]
    choice = rec["manifest"]["split_choice"]
    assert rec["status"] == "complete" and rec["config"]["prefetch_batches"] == 2
    assert rec["config"]["split_index"] == choice["chosen_split"]
    predicted = {p["split"]: p["predicted_latency_s"] for p in choice["predicted"]}
    assert set(predicted) == set(range(10))  # resnet18: k = 0..9
    assert predicted[choice["chosen_split"]] == min(predicted.values())
    assert choice["network"] == "lte" and "self_profile" in choice
    assert f"intelligent splitting chose k={choice['chosen_split']}" in run["stdout"]


@pytest.mark.slow
def test_disable_intelligent_splitting_keeps_the_default_split(tmp_path):
    rec = _runner(tmp_path, "--use-intelligent-splitting", "--disable-intelligent-splitting",
                  "--prefetch-batches", "3")["record"]
    assert rec["config"]["split_index"] == 9 // 2 and "split_choice" not in rec["manifest"]
    assert rec["config"]["prefetch_batches"] == 3


def test_intelligent_splitting_refuses_a_given_split_in_one_line():
    proc = run([PYTHON, "distributed_runner.py", "--use-intelligent-splitting", "--split-block", "3"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--split-block" in proc.stderr


@pytest.mark.slow
def test_report_consolidates_a_folder_of_hand_run_json_files(tmp_path):
    """partition1.py and partition2.py run by hand write their records into one folder (as a user
    copies them to a laptop); foreign and broken JSON files beside them are skipped, one line each."""
    folder = tmp_path / "copied"
    port = str(free_port())
    for k in ("2", "7"):
        common_args = ["--model", "resnet18", "--split", k, "--port", port, "--threads", "1", "--out", str(folder)]
        s1 = start("partition1.py", *common_args, "--host", "127.0.0.1", "--batch-size", "1", "--num-batches", "3",
                   "--warmup", "1", "--network", "lte")
        s2 = start("partition2.py", *common_args)
        assert s1.wait(180) == 0, s1.stderr.read()
        assert s2.wait(60) == 0, s2.stderr.read()
    records = sorted(folder.glob("*.json"))
    assert len(records) == 2  # both stages wrote each run's record, under the run's own name
    # A copy of one under another name (stage 2's file fetched from the other machine) is the same run.
    (folder / "from-the-server.json").write_text(records[0].read_text())
    (folder / "notes.json").write_text('{"what": "a file that is not a run record"}')
    (folder / "torn.json").write_text('{"summary": {')
    proc = run([PYTHON, "-m", "paretopipe", "report", str(folder)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = [ln for ln in proc.stderr.splitlines() if "skipping" in ln]
    assert len(skipped) == 2 and any("notes.json" in ln for ln in skipped) and any("torn.json" in ln for ln in skipped)
    runs = pd.read_csv(folder / "consolidated" / "runs.csv")
    assert sorted(runs["split_index"]) == [2, 7] and set(runs["status"]) == {"complete"}  # one row per run
    pareto = pd.read_csv(folder / "consolidated" / "report" / "pareto.csv")
    assert sorted(pareto["split_index"]) == [2, 7] and set(pareto["network"]) == {"lte"}
    assert (folder / "consolidated" / "report").glob("front_*.png")
