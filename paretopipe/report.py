"""``python -m paretopipe.report``: the documented face of ``paretopipe report`` (see :mod:`paretopipe.cli.report`)."""

if __name__ == "__main__":
    from paretopipe.cli.common import run_cli
    from paretopipe.cli.report import main

    raise SystemExit(run_cli(main))
