"""What a host can do, as one JSON object on stdout (``python -m paretopipe.controller.hostcheck``): the
code's version, commit and digest, torch, the models' weight fingerprints and cut digests, tc and root (or
passwordless sudo), whether the data port is free, netem and CUDA. ``paretopipe doctor`` runs it
on every host over SSH and compares the answers with this machine's."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from ..options import flags
from .. import __version__
from ..llm.families import family_of
from ..manifest import _git_commit, source_digest


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def check(models: Sequence[str], num_classes: int, port: int | None, device: str,
          model_dir: str | None = None) -> dict[str, Any]:
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
    prints, digests = {}, {}
    for name in models:
        # Each model's weights and its cuts, as its family reads them: what two hosts with different
        # torch versions must agree on (a language model's weights by its identity and first layer).
        try:
            family = family_of(name, model_dir)
            prints[name] = family.fingerprint(name, num_classes, model_dir)
            digests[name] = family.cut_digest(name, num_classes, model_dir)
        except Exception as exc:  # reported, not raised: the doctor's table shows it
            prints[name] = digests[name] = f"error: {str(exc).splitlines()[0][:200]}"
    out["fingerprints"], out["cut_digests"] = prints, digests
    return out


@dataclasses.dataclass(kw_only=True)
class HostcheckOptions(flags.CommandLine):
    """The check's command line (``python -m paretopipe.controller.hostcheck`` + :meth:`to_argv`): what
    ``paretopipe doctor`` writes for each host and the check parses there."""

    models: str = ""
    model_dir: str | None = flags.option(flags.MODEL_DIR)
    num_classes: int = flags.option(flags.NUM_CLASSES)
    port: int | None = None
    device: str = flags.option(flags.DEVICE)


def main(argv: Sequence[str] | None = None) -> int:
    args = HostcheckOptions.parse(argv, "python -m paretopipe.controller.hostcheck", "What this host can do, as JSON.")
    models = [m for m in args.models.split(",") if m]
    print(json.dumps(check(models, args.num_classes, args.port, args.device, args.model_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
