"""Exit statuses tell the truth: failed configurations exit non-zero with a summary line, a full disk
stops the sweep in one line and is never retried as a configuration failure, and what was written
stays valid."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PYTHON, is_root
import tcp_helpers as cli


def _sweep(out, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return cli.run([PYTHON, "automated_split_tester.py", "--model", "resnet18", "--runs", "1",
                    "--batch-size", "1", "--num-batches", "2", "--warmup", "0", "--threads", "1", "--local",
                    "--drift-every", "0",
                    "--out", str(out), "--session", "s", "--no-report", "--quiet", *args], timeout=timeout)


@pytest.mark.slow
def test_failed_configurations_exit_non_zero_with_a_summary(tmp_path):
    """Every run times out (a 1 ms per-batch timeout): the sweep finishes, says in one line that
    nothing was measured and where the errors are (the folder is kept), and exits 1."""
    proc = _sweep(tmp_path, "--splits", "4", "--timeout", "0.001", "--wait-time", "60")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: nothing was measured: every run of 1 configuration failed twice")
    assert last.endswith(str(tmp_path / "s" / "failures.csv")) and (tmp_path / "s" / "failures.csv").is_file()
    assert "resume" not in proc.stderr  # no advice to resume a session that measured nothing
    failures = json.loads((tmp_path / "s" / "session.json").read_text())["failures"]
    assert {f["attempt"] for f in failures} == {1, 2}


@pytest.fixture
def small_disk(tmp_path):
    if not is_root():
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.root
def test_a_full_disk_stops_the_sweep_in_one_line(small_disk):
    proc = _sweep(small_disk, "--splits", "0-9")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: disk full: cannot write"), proc.stderr
    assert "bytes free" in errors[0] and "--resume" in errors[0] and "Traceback" not in proc.stderr
    runs = list((small_disk / "s" / "runs").glob("*.json"))
    assert runs, "some runs fitted before the disk filled"
    for path in runs:  # every record written is whole: atomic writes left no half file
        assert json.loads(path.read_text())["status"] == "complete"
    assert not [p for p in (small_disk / "s").rglob(".*") if p.is_file()]  # no temporary file left
    session = small_disk / "s" / "session.json"
    if session.exists():  # never retried as a configuration failure
        assert not json.loads(session.read_text()).get("failures")


@pytest.mark.parametrize("model, valid", [("resnet18", "valid 0..9"),
                                          ("examples/models/skipnet.py:build", "valid 0..6")])
@pytest.mark.slow
def test_a_split_beyond_the_model_leaves_no_session_behind(tmp_path, model, valid):
    """A zoo model's splits are checked before the session folder exists; a model file's only once
    the workers built it, and then the folder, holding nothing measured, goes. Either way one line,
    exit 2, and no empty session for compare or --resume to trip over."""
    proc = cli.run([PYTHON, "automated_split_tester.py", "--model", model, "--splits", "2,99", "--local",
                    "--out", str(tmp_path / "out"), "--quiet"],
                   timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: split index 99 out of range") and valid in lines[0]
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
