#!/usr/bin/env python3
"""Sweep every split under every network profile (the suite's main job). See --help."""
from paretopipe.cli import run_cli
from paretopipe.sweep_cli import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main))
