"""``python -m paretopipe.split``: the documented face of ``paretopipe split`` (see :mod:`paretopipe.cli.split`)."""

if __name__ == "__main__":
    from paretopipe.cli.common import run_cli
    from paretopipe.cli.split import main

    raise SystemExit(run_cli(main))
