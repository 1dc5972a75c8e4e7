#!/usr/bin/env python3
"""Stage 1 (data source) of the TCP pipeline. See --help."""
from paretopipe.cli import run_cli
from paretopipe.tcp_cli import main_stage1

if __name__ == "__main__":
    raise SystemExit(run_cli(main_stage1))
