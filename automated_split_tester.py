#!/usr/bin/env python3
"""Sweep every split under every named network condition (the suite's main job). See --help."""
from paretopipe.cli.common import run_cli
from paretopipe.cli.sweep import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main))
