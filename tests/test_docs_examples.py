"""Every example in the README and docs/ works as written: Python blocks run, and every command
line parses with the real command's parser (an unknown or renamed flag fails here, not for a user).

Command lines are parsed, not run: most of them start sweeps, need hosts, root or tc netem. What
they do is proven by the tests of each command."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\n(.*?)^```\s*$", re.S | re.M)
#: Entry scripts and ``python -m`` modules -> (cli module, parser function).
SCRIPTS = {"automated_split_tester.py": ("sweep", "parser"), "partition1.py": ("stages", "stage1_parser"),
           "partition2.py": ("stages", "stage2_parser"), "distributed_runner.py": ("rpc", "parser"),
           "network_delay.py": ("netem", "parser"), "paretopipe.split": ("split", "parser"),
           "paretopipe.report": ("report", "parser"), "paretopipe.profile": ("profile", "parser"),
           "paretopipe.predict": ("predict", "parser")}
SUBCOMMANDS = {"stage1": ("stages", "stage1_parser"), "stage2": ("stages", "stage2_parser")}


def _blocks() -> list[tuple[str, str, str]]:
    out = []
    for path in DOCS:
        for m in FENCE.finditer(path.read_text()):
            out.append((f"{path.relative_to(ROOT)}:{path.read_text()[:m.start()].count(chr(10)) + 1}", m.group(1),
                        m.group(2)))
    return out


def _command_lines() -> list[tuple[str, str]]:
    lines = []
    for where, lang, body in _blocks():
        if lang not in ("", "sh", "bash", "console", "shell"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\$\s+", "", line.strip())
            line = re.sub(r"^sudo\s+", "", line)
            if re.match(r"^(python3?|paretopipe|make|bash partition\.sh)(\s|$)", line):
                lines.append((where, line))
    return lines


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser | None, list[str]]:
    """The real parser of a documented command line and the arguments it is given."""
    from paretopipe.cli.main import COMMANDS

    if argv[0] in ("python", "python3"):
        argv = argv[1:]
        if argv[0] == "-m":
            module, argv = argv[1], argv[2:]
            if module != "paretopipe":
                mod, fn = SCRIPTS[module]
                return getattr(importlib.import_module(f"paretopipe.cli.{mod}"), fn)(), argv
            argv = ["paretopipe", *argv]
        else:
            mod, fn = SCRIPTS[Path(argv[0]).name]
            return getattr(importlib.import_module(f"paretopipe.cli.{mod}"), fn)(), argv[1:]
    assert argv[0] == "paretopipe"
    if len(argv) == 1 or argv[1] in ("--help", "-h", "--version"):
        return None, []
    name, rest = argv[1], argv[2:]
    assert name in COMMANDS, f"paretopipe {name}: no such command"
    mod, fn = SUBCOMMANDS.get(name, (COMMANDS[name][0], "parser"))
    return getattr(importlib.import_module(f"paretopipe.cli.{mod}"), fn)(), rest


PYTHON_BLOCKS = [(w, body) for w, lang, body in _blocks() if lang == "python"]
COMMANDS_SHOWN = _command_lines()


def test_the_docs_show_python_and_commands():
    assert PYTHON_BLOCKS, "the README's Python API has an example"
    assert len(COMMANDS_SHOWN) >= 20


@pytest.mark.parametrize("where,body", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_python_example_runs(where, body, tmp_path):
    proc = subprocess.run([PYTHON, "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{where}: {proc.stderr[-1500:]}"


@pytest.mark.parametrize("where,line", COMMANDS_SHOWN, ids=[f"{w} {l[:60]}" for w, l in COMMANDS_SHOWN])
def test_documented_command_line_parses(where, line):
    argv = shlex.split(line, comments=True)
    if argv[0] == "make":
        targets = re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M)
        assert all(t in targets for t in argv[1:]), f"{where}: {line}: no such make target"
        return
    if argv[:2] == ["bash", "partition.sh"]:
        proc = subprocess.run(["bash", str(ROOT / "partition.sh"), "--help"], capture_output=True, text=True)
        usage = proc.stdout
        for flag in (a for a in argv[2:] if a.startswith("--")):
            assert flag.split("=")[0] in usage, f"{where}: {line}: partition.sh has no {flag}"
        return
    if argv[0].startswith("python") and argv[1].startswith("benchmarks/"):
        proc = subprocess.run([PYTHON, str(ROOT / argv[1]), "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{where}: {line}: {proc.stderr[-500:]}"
        for flag in (a for a in argv[2:] if a.startswith("--")):
            assert flag.split("=")[0] in proc.stdout, f"{where}: {line}: the benchmark has no {flag}"
        return
    parser, args = _parser_for(argv)
    if parser is None:  # the umbrella command's own --help
        return
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        assert exc.code == 0, f"{where}: {line}: the parser refused it"


#: A documented command that needs what this machine lacks says so in its comment: ``# needs ...``.
NEEDS = re.compile(r"#\s*needs\b")


def test_every_documented_command_line_runs_in_a_test_or_names_the_hardware_it_needs():
    """The walkthrough (tests/test_walkthrough.py) runs each line, reduced in size only; a line it
    cannot run names what it needs (a Pi, a GPU, a second host). ``make`` lines are the README's
    own two commands and its other targets (their existence is checked above; CI runs make test)."""
    from test_walkthrough import RUN

    ran = {tuple(shlex.split(line, comments=True)) for line in RUN}
    left = [f"{where}: {line}" for where, line in COMMANDS_SHOWN
            if not line.startswith("make ") and not NEEDS.search(line)
            and tuple(shlex.split(line, comments=True)) not in ran]
    assert not left, "run these in tests/test_walkthrough.py or mark what they need:\n" + "\n".join(left)
    shown = {tuple(shlex.split(line, comments=True)) for _, line in COMMANDS_SHOWN}  # quoting as the docs quote
    stale = {line for line in RUN if tuple(shlex.split(line, comments=True)) not in shown}
    assert not stale, f"the walkthrough runs lines the docs no longer show: {sorted(stale)}"
