"""``python -m paretopipe``: the same as the ``paretopipe`` command."""

from paretopipe.cli.main import entry

entry()
