"""``python -m paretopipe.profile``: the documented face of ``paretopipe profile`` (see :mod:`paretopipe.cli.profile`)."""

if __name__ == "__main__":
    from paretopipe.cli.common import run_cli
    from paretopipe.cli.profile import main

    raise SystemExit(run_cli(main))
