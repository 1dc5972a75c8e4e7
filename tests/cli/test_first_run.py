"""A new user's first commands, on a machine that has never run a library: empty matplotlib, torch
and Hugging Face caches. Only the project's own lines reach the terminal (matplotlib builds its font
cache on its first import and says so at INFO, which once turned a one-line error into two)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT


def _fresh_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PI1_IP", "PI2_IP", "GPU_IP", "HOSTS")}
    for var in ("MPLCONFIGDIR", "TORCH_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        (tmp / var).mkdir()
        env[var] = str(tmp / var)
    return env


@pytest.mark.parametrize("argv, code, what", [
    (["report", "{tmp}/nothing"], 2, "no sweep results"),
    (["sweep", "--model", "nope", "--local", "--dry-run"], 2, "unknown model 'nope'"),
    (["sweep", "--help"], 0, None),
], ids=["report-missing", "sweep-bad-model", "sweep-help"])
def test_a_first_run_with_empty_caches_prints_only_the_projects_line(tmp_path, argv, code, what):
    env = _fresh_env(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([PYTHON, "-m", "paretopipe", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    if what is None:
        assert lines == [] and "usage:" in proc.stdout, proc.stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], proc.stderr
    # The caches really were empty: matplotlib built its font cache in this very run.
    assert argv[0] != "report" or any((tmp_path / "MPLCONFIGDIR").iterdir())


def test_a_librarys_info_line_is_held_back_and_the_projects_is_shown(capsys):
    import logging

    from paretopipe.cli.common import setup_logging

    setup_logging()
    logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
    logging.getLogger("some.library").warning("a library's warning")
    logging.getLogger("paretopipe.sweep").info("the project's own line")
    err = capsys.readouterr().err
    assert "fontManager" not in err and "a library's warning" in err and "the project's own line" in err
    setup_logging(debug=True)
    logging.getLogger("matplotlib.font_manager").debug("shown with --debug")
    assert "shown with --debug" in capsys.readouterr().err
    setup_logging()
