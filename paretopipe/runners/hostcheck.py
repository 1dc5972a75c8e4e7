"""What a host can do, as one JSON object on stdout (``python -m paretopipe.runners.hostcheck``): the
code's version, commit and digest, torch, the models' weight fingerprints and cut digests, tc and root (or
passwordless sudo), whether the data port is free, netem and CUDA. ``paretopipe doctor`` runs it
on every host over SSH and compares the answers with this machine's."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from . import flags
from .. import __version__
from ..manifest import _git_commit, source_digest


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def check(models: Sequence[str], num_classes: int, port: int | None, device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"hostname": socket.gethostname(), "paretopipe": __version__, "git_commit": _git_commit(),
                           "source_digest": source_digest(), "python": sys.version.split()[0],
                           "machine": platform.machine()}
    root = os.geteuid() == 0
    sudo = root or (shutil.which("sudo") is not None and
                    subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0)
    out.update(root=root, sudo=sudo, tc=shutil.which("tc") is not None, ip=shutil.which("ip") is not None,
               netem=Path("/sys/module/sch_netem").exists(),
               port_free=None if port is None else port_free(port))
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_build"] = "cuda" if torch.version.cuda else "cpu"
        out["cuda_available"] = torch.cuda.is_available()
        out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError as exc:
        out["torch"] = None
        out["error"] = f"torch does not import: {exc}"
        return out
    out["device_ok"] = device == "cpu" or (out["cuda_available"] and
                                           (device == "cuda" or int(device.split(":")[1]) < out["cuda_devices"]))
    # lazy for start-up: torch
    from ..partition import models as zoo

    prints = {}
    for name in models:
        try:
            prints[name] = zoo.fingerprint(zoo.build(name, num_classes=num_classes))
        except Exception as exc:  # reported, not raised: the doctor's table shows it
            prints[name] = f"error: {str(exc).splitlines()[0][:200]}"
    out["fingerprints"] = prints
    out["cut_digests"] = {name: cut_digest(name, num_classes) for name in models}
    return out


def cut_digest(model: str, num_classes: int) -> str:
    """A digest of ``model``'s cut points (names, shapes, dtypes) and block cuts: what two hosts with
    different torch versions must agree on to split the model the same way."""
    # lazy for start-up: torch
    from ..partition.tables import partitioner_for

    try:
        _, part = partitioner_for(model, num_classes=num_classes, structure_only=True)
    except Exception as exc:  # reported, not raised: the doctor's table shows it
        return f"error: {str(exc).splitlines()[0][:200]}"
    cuts = [[c.name, list(c.shape), c.dtype] for c in part.cuts]
    text = json.dumps({"cuts": cuts, "blocks": part.block_cuts()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paretopipe.runners.hostcheck")
    p.add_argument("--models", default="")
    flags.NUM_CLASSES.add_to(p)
    p.add_argument("--port", type=int, default=None)
    flags.DEVICE.add_to(p)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    print(json.dumps(check(models, args.num_classes, args.port, args.device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
