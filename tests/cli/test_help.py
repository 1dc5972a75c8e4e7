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


def _parsers():
    """Every command's parser, by the umbrella command's table (the anchor scripts are the same parsers)."""
    import importlib

    from paretopipe.cli.main import COMMANDS

    fns = {"stage1": "stage1_parser", "stage2": "stage2_parser"}
    for name, (module, _, _) in COMMANDS.items():
        yield name, getattr(importlib.import_module(f"paretopipe.cli.{module}"), fns.get(name, "parser"))()


def _with_subcommands(parser):
    """The parser and each of its subcommands' parsers (``netem apply``, ``lab up``, ...)."""
    import argparse

    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _with_subcommands(sub)


@pytest.mark.parametrize("name,parser", list(_parsers()), ids=[n for n, _ in _parsers()])
def test_help_names_every_flag_and_its_examples_parse(name, parser):
    """Each option a parser accepts is named in its --help, and every example in the help's
    ``examples:`` section is a command line that the same parser accepts."""
    import argparse
    import shlex

    from test_docs_examples import _parser_for

    for p in _with_subcommands(parser):
        text = p.format_help()
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert flag in text, f"{p.prog} --help does not name {flag}"
    text = parser.format_help()
    assert "examples:" in text, f"{parser.prog} --help shows no examples"
    examples = [line.strip() for line in text.split("examples:", 1)[1].splitlines() if line.strip()]
    assert examples
    for line in examples:
        argv = shlex.split(line, comments=True)
        if argv[0] == "sudo":
            argv = argv[1:]
        example_parser, args = _parser_for(argv)
        if example_parser is None:
            continue
        try:
            example_parser.parse_args(args)
        except SystemExit as exc:
            assert exc.code == 0, f"{parser.prog}: its example {line!r} does not parse"
