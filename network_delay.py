#!/usr/bin/env python3
"""Apply / clear / show tc network profiles and measure links. See --help."""
from paretopipe.cli import run_cli
from paretopipe.netem_cli import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main))
