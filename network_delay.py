#!/usr/bin/env python3
"""Apply / clear / show tc network conditions and measure links. See --help."""
from paretopipe.cli.common import run_cli
from paretopipe.cli.netem import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main))
