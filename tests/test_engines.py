"""Engine names and labels (paretopipe.engines): one engine for every stage or one per stage, each
checked, and an engine whose package is missing refused in one line that names the package."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PYTHON, ROOT
from paretopipe import engines
from paretopipe.errors import UsageError


def test_lists_and_per_stage_labels():
    assert engines.parse_engines("torch, ONNXRuntime,torch") == ["torch", "onnxruntime"]
    assert engines.stage_engines_label("onnxruntime,torch", 2) == "onnxruntime+torch"
    assert engines.stage_engines_label("openvino,openvino", 2) == "openvino"  # the same engine: one name
    assert [engines.stage_engine("onnxruntime+torch", i) for i in (0, 1)] == ["onnxruntime", "torch"]
    assert [engines.stage_engine("openvino", i) for i in (0, 1, 2)] == ["openvino"] * 3
    assert engines.only_torch("torch") and not engines.only_torch("torch+onnxruntime")
    engines.check_label("onnxruntime+torch+torch", 3)
    with pytest.raises(UsageError, match="names 2 engines for a 3-stage split"):
        engines.check_label("onnxruntime+torch", 3)
    with pytest.raises(UsageError, match="unknown engine 'tvm'; valid: torch, onnxruntime, openvino"):
        engines.parse_engines("torch,tvm")
    with pytest.raises(UsageError, match=r"give one engine per stage \(3\), e.g. onnxruntime,torch,torch"):
        engines.stage_engines_label("onnxruntime,torch", 3)


def test_installed_engines_report_their_versions():
    for engine in (e for e in engines.ENGINES if e not in engines.PEERS):  # a peer's build: tests/llm/test_llamacpp.py
        assert engines.require(engine) is not None
        assert engines.version(engine)
    assert engines.manifest("torch", 1) == {"engine": "torch", "version": engines.version("torch"), "threads": 1}


def test_an_engine_whose_package_is_missing_is_refused_in_one_line_that_names_it(tmp_path):
    """A real sweep command in a process where importing onnxruntime fails, as it does where the
    package is not installed: one line, exit 2, before anything starts."""
    code = ("import sys; sys.modules['onnxruntime'] = None\n"
            "from paretopipe.cli.main import entry\n"
            "sys.argv = ['paretopipe', 'sweep', '--model', 'mobilenetv2', '--local', '--splits', '3', '--engine',"
            f" 'torch,onnxruntime', '--out', {str(tmp_path)!r}]\n"
            "entry()\n")
    done = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert lines == ["error: --engine onnxruntime: the onnxruntime package is not installed here; install it with "
                     "pip install 'paretopipe[engines]' (or pip install onnxruntime)"], done.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_openvino_is_imported_without_its_telemetry_which_forks_and_reaches_for_the_network():
    """Importing openvino sends usage telemetry from a forked process; under a stage worker that
    child hung for ever (an orphan after every OpenVINO sweep). Through engines.require it forks
    nothing and sends nothing."""
    code = ("import time, psutil\n"
            "from paretopipe import engines\n"
            "engines.require('openvino')\n"
            "time.sleep(2)\n"
            "import sys\n"
            "print(sys.modules['openvino_telemetry'], len(psutil.Process().children(recursive=True)))\n")
    done = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "0"]
