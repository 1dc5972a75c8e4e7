"""Running notebooks/pareto_front.ipynb headless for the tests, with settings in its environment."""

from __future__ import annotations

import os

from conftest import ROOT


def execute(nb, env: dict[str, str]) -> str:
    """Execute ``nb`` (an nbformat notebook) in a kernel that sees ``env``; returns its text outputs.
    The variables are set for the kernel's start and put back as they were afterwards."""
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
