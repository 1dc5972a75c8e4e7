"""Every command-line face answers --help with examples, and exits 0."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PYTHON, ROOT

COMMANDS = [["partition1.py"], ["partition2.py"], ["distributed_runner.py"], ["automated_split_tester.py"],
            ["network_delay.py"], ["network_delay.py", "apply"], ["network_delay.py", "measure"],
            ["-m", "paretopipe.split"], ["-m", "paretopipe.report"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_works_shows_examples_and_imports_no_torch(cmd):
    """--help answers in a fraction of a second: importing torch and torchvision costs about 4.5 s
    of CPU (a Pi: far more), and a flag refused by argparse is as cheap."""
    out = subprocess.run([PYTHON, "-X", "importtime", *cmd, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "Traceback" not in out.stderr
    if cmd[-1] not in ("apply", "measure"):
        assert "examples:" in out.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "torchvision" not in imported


def test_partition_sh_help():
    out = subprocess.run(["bash", "partition.sh", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "Usage: bash partition.sh" in out.stdout
