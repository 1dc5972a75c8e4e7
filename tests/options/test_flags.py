"""The option catalogue: each option that several commands take is declared once, with the
choices its values have where they are defined, and a process's command line is one dataclass
that writes and parses it."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import PYTHON, ROOT
from paretopipe.options import flags
from paretopipe.controller.rpc_ranks import RankOptions
from paretopipe.controller.worker import WorkerOptions
from paretopipe import wiredtype
from paretopipe.transport import runconfig

ROWS = [v for v in vars(flags).values() if isinstance(v, flags.Option)]


def test_no_parser_declares_a_catalogued_option_again():
    declared = re.compile(r"""add_argument\(\s*["'](--[a-z0-9-]+)["']""")
    again = []
    for path in (ROOT / "paretopipe").rglob("*.py"):
        for m in declared.finditer(path.read_text()):
            if any(m.group(1) == row.flags[0] for row in ROWS):
                again.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
    assert not again, again


def test_every_option_is_declared_in_one_place_across_the_package():
    # house_metrics counts add_argument calls and catalogue rows (options/flags.Option, the sweep's
    # Flag) by their first flag: a command that means something more particular by an option gives
    # the row its own help or default, and a sweep's comma list is a variant of the row.
    proc = subprocess.run([PYTHON, "scripts/house_metrics.py"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "options declared in more than one place: 0" in proc.stdout, proc.stdout
    assert "import cycles (imports inside functions count): 0" in proc.stdout, proc.stdout


def test_choices_are_the_values_where_they_are_defined():
    assert flags.RPC_TRANSPORT.choices == runconfig.RPC_TRANSPORTS
    assert flags.RPC_SOURCE.choices == runconfig.RPC_SOURCES
    assert flags.WIRE_DTYPE.choices == wiredtype.WIRE_DTYPE_CHOICES == (*runconfig.WIRE_DTYPE_NAMES, "auto")
    assert flags.COMPRESSION.choices == runconfig.COMPRESSIONS
    assert flags.LINK.choices == runconfig.LINK_MODES and flags.OBJECTIVE.choices == runconfig.OBJECTIVES
    assert flags.NUM_CLASSES.default == runconfig.RunConfig.__dataclass_fields__["num_classes"].default


@pytest.mark.parametrize("command", [
    ["partition1.py", "--split", "3"], ["partition2.py"], ["distributed_runner.py", "--local"],
    ["-m", "paretopipe.split", "--model", "mobilenetv2"], ["-m", "paretopipe.profile", "--model", "mobilenetv2",
                                                            "--out", "x.json"],
    ["-m", "paretopipe", "sweep", "--dry-run"], ["-m", "paretopipe", "doctor"],
    ["-m", "paretopipe.controller.worker", "--role", "stage1", "--model", "mobilenetv2"],
])
def test_every_command_refuses_a_non_positive_num_classes_in_one_line(command, tmp_path):
    proc = subprocess.run([PYTHON, *command, "--num-classes", "0"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-400:]
    assert "--num-classes" in proc.stderr and "'0' is out of range: a whole number of at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_process_command_line_is_written_and_parsed_by_one_declaration():
    worker = WorkerOptions(role="stage2", model="resnet18", num_classes=7, threads=2, cpus="0-1", cpu_share=0.25)
    argv = worker.to_argv()
    assert argv == ["--model", "resnet18", "--num-classes", "7", "--device", "cpu", "--threads", "2", "--cpus", "0-1",
                    "--role", "stage2", "--cpu-share", "0.25"]
    assert WorkerOptions.parse(argv, "w", "") == worker
    rank = RankOptions(rank=2, world_size=3, master_addr="127.0.0.1", master_port=29500, model="m", weights="w.pth",
                       transport="auto", source="stage1", join_timeout=12.5)
    assert RankOptions.parse(rank.to_argv(), "r", "") == rank
    assert rank.to_argv()[rank.to_argv().index("--rpc-transport") + 1] == "auto"
    with pytest.raises(SystemExit):  # the catalogue's choices hold on a process's command line too
        RankOptions.parse([*rank.to_argv(), "--rpc-transport", "shm"], "r", "")
    with pytest.raises(SystemExit):  # a required field is required
        WorkerOptions.parse(["--role", "stage1"], "w", "")
