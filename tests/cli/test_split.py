"""``python -m paretopipe.split`` (cli.split): it lists a model's blocks, and a bad model name is
one line and exit 2."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, ROOT


def test_cli_lists_blocks_and_errors_in_one_line():
    ok = subprocess.run([PYTHON, "-m", "paretopipe.split", "--model", "resnet18", "--list"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0
    lines = ok.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["k", "block", "cut"] and len(lines) == 1 + 10
    assert "layer1.0" in ok.stdout and "(whole model)" in ok.stdout
    bad = subprocess.run([PYTHON, "-m", "paretopipe.split", "--model", "nope", "--list"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
