"""The package's layers hold: import-linter's contracts pass, the arithmetic needs no torch, and
nothing at run time reaches outside the package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(PYTHON).parent))
    assert lint, "lint-imports is installed by make (import-linter, the test extra)"
    proc = subprocess.run([lint, "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 3
    assert proc.stdout.count("KEPT") == len(contracts) and "BROKEN" not in proc.stdout


def test_cost_model_and_planner_import_without_torch():
    code = ("import sys, paretopipe.predict.costmodel, paretopipe.predict.planner, "
            "paretopipe.predict.device_profile; assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr


def test_the_planner_runs_without_torch_on_a_synthetic_chain():
    code = """
import sys
from paretopipe.predict.costmodel import LinkModel
from paretopipe.predict.device_profile import synthetic_profile
from paretopipe.predict.planner import pareto_plans
p = synthetic_profile([1e-3] * 4, [100] * 5)
plans = pareto_plans([p, p, p], [LinkModel.of(rate_bps=1e6)] * 2, 1, range(5))
assert plans and 'torch' not in sys.modules
print(len(plans))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0 and int(proc.stdout) >= 1, proc.stderr


@pytest.mark.parametrize("package", ["partition", "network", "transport", "controller", "analysis", "predict", "cli"])
def test_each_subpackage_has_tests_and_a_docstring(package):
    assert list((ROOT / "tests" / package).glob("test_*.py")), f"tests/{package}/ has no test module"
    import ast

    doc = ast.get_docstring(ast.parse((ROOT / "paretopipe" / package / "__init__.py").read_text())) or ""
    assert len(doc.split()) >= 4, f"paretopipe/{package}/__init__.py names its job in a docstring, not {doc!r}"


def test_no_module_reads_outside_the_package():
    """profiles.toml is package data; no module joins a path to the repository's folders or scripts,
    and the benchmarks import only the package (the wheel test in tests/cli proves it by running
    from outside the repository)."""
    import re

    reach = re.compile(r"""/\s*["'](netem|tests|notebooks|examples|benchmarks)["']|/\s*["'][a-z_0-9]+\.(py|sh)["']""")
    # The manifest reads torch's and torchvision's installed version.py as text (their full version
    # without importing them): a file of another installed package, not of this repository.
    allowed = {'paretopipe/manifest.py: / "version.py"'}
    offenders = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in (ROOT / "paretopipe").rglob("*.py")
                 for m in reach.finditer(path.read_text())]
    assert not set(offenders) - allowed, offenders
    assert (ROOT / "paretopipe" / "network" / "profiles.toml").is_file()
    for bench in (ROOT / "benchmarks").glob("*.py"):
        text = bench.read_text()
        assert "sys.path.insert" not in text and "from tests" not in text, bench.name


def test_every_module_has_its_test_module_or_names_where_it_is_tested():
    """tests/x/test_y.py for paretopipe/x/y.py, or a row of tests/README.md naming test modules that
    exist (a module observable only where it is used: a CLI face, a backend's side of a socket)."""
    import re

    rows = {m: re.findall(r"`(tests/[^`]+\.py)`", rest) for m, rest in
            re.findall(r"^\| `(paretopipe/[^`]+\.py)` \|(.*)$", (ROOT / "tests" / "README.md").read_text(), re.M)}
    modules = [p for p in (ROOT / "paretopipe").rglob("*.py") if p.stem not in ("__init__", "__main__")]

    def mirror(module: Path) -> Path:  # paretopipe/x/y.py -> tests/x/test_y.py
        return ROOT / "tests" / module.parent.relative_to(ROOT / "paretopipe") / f"test_{module.stem}.py"

    missing = [str(p.relative_to(ROOT)) for p in modules
               if not mirror(p).is_file() and str(p.relative_to(ROOT)) not in rows]
    assert not missing, f"no test module and no row in tests/README.md: {missing}"
    for module, files in rows.items():
        assert (ROOT / module).is_file(), f"tests/README.md names {module}, which is gone"
        assert not mirror(ROOT / module).is_file(), f"{module} has its own test module: drop its row"
        assert files and all((ROOT / f).is_file() for f in files), f"{module}: {files} must exist"


def test_a_package_import_inside_a_function_says_why():
    """No import inside a function dodges a cycle: the package's modules form a DAG at import time
    (the contracts above count function-level imports too). What stays inside a function is kept
    there for start-up time, and a comment above it says which heavy library it defers."""
    import ast

    unexplained = []
    for path in (ROOT / "paretopipe").rglob("*.py"):
        lines = path.read_text().split("\n")
        tree = ast.parse("\n".join(lines))
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level > 0:
                    said = "lazy" in lines[node.lineno - 1] or "lazy" in lines[node.lineno - 2]
                    if not said:
                        unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unexplained, unexplained


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by their basename (tests/ has no packages): two files of one name
    in different folders make a collection error that ends the whole run."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


#: File names that more than one module of the package has, and why each is kept (issue 68): the
#: same role in sibling places, never two unrelated things under one name.
SHARED_NAMES = {
    # A command's face in cli/ is named for the command, beside what it runs.
    "broker.py": ("cli/broker.py", "transport/messaging/broker.py"),
    "compare.py": ("cli/compare.py", "analysis/compare.py"),
    "doctor.py": ("cli/doctor.py", "controller/doctor.py"),
    "lab.py": ("cli/lab.py", "controller/lab.py"),
    "subsets.py": ("cli/subsets.py", "predict/subsets.py"),
    "stages.py": ("cli/stages.py", "partition/stages.py"),
    # The anchor's documented faces, `python -m paretopipe.<x>` and `import paretopipe.models`, beside
    # the command or the code they face.
    "split.py": ("split.py", "cli/split.py"),
    "profile.py": ("profile.py", "cli/profile.py"),
    "report.py": ("report.py", "cli/report.py", "analysis/report.py"),
    "models.py": ("models.py", "partition/models.py"),
    # Each package's figures for a run's summary: energy's and a generation's.
    "summary.py": ("energy/summary.py", "llm/summary.py"),
}


def test_no_two_modules_share_a_file_name_but_the_kept_ones():
    package = ROOT / "paretopipe"
    by_name: dict[str, list[str]] = {}
    for path in package.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts:
            by_name.setdefault(path.name, []).append(str(path.relative_to(package)))
    shared = {name: tuple(sorted(where)) for name, where in by_name.items() if len(where) > 1}
    assert shared == {name: tuple(sorted(where)) for name, where in SHARED_NAMES.items()}, (
        "a module's file name is another's: rename it for what it holds, or keep it in SHARED_NAMES with why")
