"""scripts/house_metrics.py as the house's gate (issue 68): it fails on a checkout that breaks a
limit and names each breach, warns near a limit, and passes this checkout (make test runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "house_metrics.py"), str(root)],
                          capture_output=True, text=True, timeout=120)


def _checkout(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"paretopipe/__init__.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "tests").mkdir(exist_ok=True)
    return tmp_path


def _function(name: str, lines: int) -> str:
    return f"def {name}():\n" + "    x = 1\n" * (lines - 2) + "    return x\n"


def test_a_checkout_over_every_limit_fails_and_each_breach_is_named(tmp_path):
    root = _checkout(tmp_path, {
        "paretopipe/big.py": "x = 1\n" * 501,
        "paretopipe/long.py": _function("long_one", 61),
        "paretopipe/a.py": "from . import b\n",
        "paretopipe/b.py": "from . import a\n",
        "paretopipe/cli.py": 'p.add_argument("--model")\nq.add_argument("--model")\n'})
    done = _run(root)
    errors = [line for line in done.stdout.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(errors) == 4, errors
    assert "paretopipe/big.py has 501 lines, over the 500-line limit" in errors[0]
    assert "paretopipe/long.py:long_one has 61 lines, over the 60-line limit" in errors[1]
    assert "an import cycle" in errors[2] and "paretopipe.a" in errors[2] and "paretopipe.b" in errors[2]
    assert errors[3].startswith("error: option --model declared in 2 places: paretopipe/cli.py:1, paretopipe/cli.py:2")


def test_near_a_limit_is_a_warning_and_the_limits_themselves_pass(tmp_path):
    root = _checkout(tmp_path, {"paretopipe/near.py": "x = 1\n" * 450, "paretopipe/at.py": _function("sixty", 60)})
    done = _run(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "error:" not in done.stdout
    assert "warning: 1 modules within 100 lines of the 500-line limit: paretopipe/near.py 450" in done.stdout
    assert "warning: 1 functions within 10 lines of the 60-line limit: paretopipe/at.py:sixty 60" in done.stdout


def test_this_checkout_passes_the_gate():
    done = _run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "modules over 500 lines: 0" in done.stdout and "functions over 60 lines: 0" in done.stdout


def test_every_way_of_asking_which_workload_is_counted_outside_the_module_that_answers(tmp_path):
    root = _checkout(tmp_path, {
        "paretopipe/workload.py": "def generates(w):\n    return w.generates\n",  # the answer: not counted
        "paretopipe/a.py": ("def f(cfg, gen, feed):\n    if cfg.workload.generates or gen is None:\n"
                            "        return feed is not None\n    return is_language_model(cfg)\n"),
        "paretopipe/b.py": "def g(t):\n    return is_generation(t) and t.language_model\n",
        "paretopipe/c.py": "def h(general):\n    return general is None\n",  # another name: not a workload's
    })
    out = _run(root).stdout
    assert "workload asked: 6 times in 2 modules (most: paretopipe/a.py 4, paretopipe/b.py 2)" in out
