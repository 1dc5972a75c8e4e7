#!/usr/bin/env python3
"""N-stage pipeline over torch.distributed.rpc. See --help."""
from paretopipe.cli.common import run_cli
from paretopipe.cli.rpc import main

if __name__ == "__main__":
    raise SystemExit(run_cli(main))
