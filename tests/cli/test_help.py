"""Every command-line face answers --help with examples, and exits 0."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PYTHON, ROOT

COMMANDS = [["partition1.py"], ["partition2.py"], ["distributed_runner.py"], ["automated_split_tester.py"],
            ["network_delay.py"], ["network_delay.py", "apply"], ["network_delay.py", "measure"],
            ["-m", "paretopipe.split"], ["-m", "paretopipe.report"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_works_and_shows_examples(cmd):
    out = subprocess.run([PYTHON, *cmd, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "Traceback" not in out.stderr
    if cmd[-1] not in ("apply", "measure"):
        assert "examples:" in out.stdout


def test_partition_sh_help():
    out = subprocess.run(["bash", "partition.sh", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "Usage: bash partition.sh" in out.stdout
