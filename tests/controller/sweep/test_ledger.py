"""The sweep's ledger on a real session folder: records written by a scripted sweep (no stage
processes) taken back on --resume and refused when unreadable, failures carried from one
invocation to the next, and a full disk turned into one line that keeps what was written."""

from __future__ import annotations

import errno
import json

import pytest

import scripted_group
from paretopipe.analysis.session import Session
from paretopipe.controller import sweep
from paretopipe.controller.sweep.ledger import DiskFullError, SweepLedger


@pytest.fixture
def swept(tmp_path):
    """A session of four runs (two splits, two runs each), written by the scripted sweep."""
    opts = sweep.SweepOptions(models=["mobilenetv2"], splits="2,4", networks=["lan"], runs=2, batch_size=1,
                              num_batches=3, warmup=1, out=str(tmp_path), session="s", report=False, seed=7,
                              drift_every_s=0)
    sweeper = sweep.Sweeper(opts, scripted_group.factory(lambda cfg, i: 0.01 + 0.001 * cfg["split_index"]))
    assert sweeper.run().measured == 4
    return Session(tmp_path / "s")


def test_a_completed_run_is_taken_back_only_on_resume_and_only_while_readable(swept, caplog):
    ledger = SweepLedger(swept)
    path = sorted(swept.runs_dir.glob("*.json"))[0]
    key = path.stem
    assert ledger.resumed(key, resume=False) is None
    record = ledger.resumed(key, resume=True)
    assert record is not None and record.status == "complete" and record.to_dict() == json.loads(path.read_text())
    path.write_text(json.dumps({"status": "complete", "schema_version": "from elsewhere"}))
    assert ledger.resumed(key, resume=True) is None  # measured again, not trusted
    assert path.name in caplog.text and "WARNING" in caplog.text  # said, not silently dropped


def test_failures_are_counted_into_session_json_and_carried_to_the_next_invocation(swept):
    ledger = SweepLedger(swept)
    meta = ledger.load_meta({"runs": 2}, {})
    ledger.failed("x_r0", 1, "stage 2 went away")
    ledger.consolidate(meta, final=True)
    written = json.loads(swept.meta_path.read_text())
    assert written["runs_complete"] == 4 and written["complete"]
    assert [f["error"] for f in written["failures"]] == ["stage 2 went away"]
    again = SweepLedger(swept)
    resumed = again.load_meta({"runs": 2}, {})
    assert resumed.created_utc == written["created_utc"]
    assert len(resumed.resumed_utc) == len(written["resumed_utc"]) + 1  # each invocation after the first adds one
    assert [f["run_key"] for f in again.failures] == ["x_r0"]


def test_a_full_disk_is_one_line_naming_the_file_and_what_to_do(swept):
    ledger = SweepLedger(swept)

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFullError, match=r"disk full: cannot write .*runs\.csv \(\d+ bytes free.*--resume"):
        ledger.write(full, swept.path / "runs.csv")
    with pytest.raises(PermissionError):  # anything else is not a full disk: it goes on as it was
        ledger.write(lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")), swept.path / "x")
    assert len(list(swept.runs_dir.glob("*.json"))) == 4
