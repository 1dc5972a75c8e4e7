"""``python -m paretopipe.predict``: the documented face of ``paretopipe predict``."""

from paretopipe.cli.common import run_cli
from paretopipe.cli.predict import main

raise SystemExit(run_cli(main))
