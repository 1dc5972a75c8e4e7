#!/usr/bin/env python3
"""Stage 2 of the TCP pipeline. See --help."""
from paretopipe.cli.common import run_cli
from paretopipe.cli.stages import main_stage2

if __name__ == "__main__":
    raise SystemExit(run_cli(main_stage2))
