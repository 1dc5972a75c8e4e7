"""tests/cpu_accounting.py counts a test's own processes: a test whose child spins a core for a
second is charged about that second, and one that sleeps is charged next to nothing."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, is_root


@pytest.mark.root
def test_a_tests_child_processes_cpu_is_charged_to_that_test(tmp_path):
    if not is_root():
        pytest.skip("a cgroup of its own needs root")
    (tmp_path / "test_spin.py").write_text(textwrap.dedent("""
        import subprocess, sys, time

        def test_spins_in_a_child():
            subprocess.run([sys.executable, "-c",
                            "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"],
                           check=True)

        def test_sleeps():
            time.sleep(1.0)
    """))
    out = tmp_path / "cpu"
    groups = Path("/sys/fs/cgroup/cpuacct")
    before = set(groups.glob("paretopipe-test-cpu-*"))  # a run under make test-cpu has its own
    proc = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-p", "cpu_accounting", str(tmp_path / "test_spin.py")], cwd=ROOT / "tests",
                          capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"},
                               "PARETOPIPE_TEST_CPU": str(out)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split(",", 2)[2].split("::")[-1]: float(line.split(",")[0])
            for line in (out / "main.csv").read_text().splitlines()}
    assert 0.9 <= rows["test_spins_in_a_child"] < 3.0, rows
    assert rows["test_sleeps"] < 0.3, rows
    summary = subprocess.run([PYTHON, "tests/cpu_accounting.py", str(out)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60).stdout
    assert summary.startswith("2 tests, ") and "test_spins_in_a_child" in summary.splitlines()[2]
    assert set(groups.glob("paretopipe-test-cpu-*")) <= before  # the inner run's group is gone
