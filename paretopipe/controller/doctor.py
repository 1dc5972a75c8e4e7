"""Preflight for a testbed (``paretopipe doctor``, ``sweep --check``): every host reachable over SSH
and running the same code, torch and weights as this machine, with tc, root (or passwordless
sudo), a free data port and CUDA where it was asked for. One table, then one line per problem.

``--deploy`` ships this working tree to each host's REMOTE_DIR over the same SSH channel, so no
checkout is needed there, and reuses the host's Python if it can run the package or makes a
virtual environment there.
"""

from __future__ import annotations

import io
import json
import logging
import shlex
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from ..manifest import STAMP, _git_commit, source_digest
from ..sshcmd import remote_path
from ..partition.names import DEFAULT_NUM_CLASSES
from .hosts import Host, Testbed
from .hostcheck import HostcheckOptions, check

log = logging.getLogger("paretopipe.doctor")
COLUMNS = ("host", "ssh", "device", "arch", "commit", "digest", "torch", "build", "weights", "tc", "root", "port",
           "cuda")
#: CPU architectures of edge boards that no CUDA build of torch serves (a Jetson's aarch64 does:
#: it has CUDA devices, which the check sees).
EDGE_ARCHES = ("aarch64", "armv7l")


def cuda_build_warning(name: str, got: dict[str, Any]) -> str | None:
    """A CUDA build of torch on an ARM host with no CUDA device: gigabytes of libraries it cannot use."""
    if got.get("machine") in EDGE_ARCHES and got.get("torch_build") == "cuda" and not got.get("cuda_available"):
        return (f"{name}: torch {got.get('torch')} is a CUDA build on an {got.get('machine')} host without a CUDA "
                f"device (about 2.5 GB of NVIDIA libraries it cannot use); install the CPU build: pip install torch "
                f"torchvision --index-url https://download.pytorch.org/whl/cpu (docs/install.md)")
    return None


def probe(host: Host, models: Sequence[str], num_classes: int, port: int, timeout: float = 600,
          model_dir: str | None = None) -> dict[str, Any]:
    """The host's hostcheck answer, or ``{"ssh": error}`` when it cannot be reached or run."""
    args = HostcheckOptions(models=",".join(models), model_dir=model_dir, num_classes=num_classes, port=port,
                            device=host.device).to_argv()
    try:
        out = subprocess.run(host.argv("paretopipe.controller.hostcheck", args), capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ssh_error": f"no answer within {timeout:g}s"}
    except OSError as exc:
        return {"ssh_error": str(exc)}
    if out.returncode != 0:
        text = " ".join((out.stderr or out.stdout).split())[-300:]
        return {"ssh_error": text or f"exit status {out.returncode}"}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ssh_error": f"unexpected answer: {out.stdout[-200:]!r}"}


def reference(models: Sequence[str], num_classes: int, model_dir: str | None = None) -> dict[str, Any]:
    """This machine's side of the comparison."""
    return check(models, num_classes, None, "cpu", model_dir)


def check_testbed(testbed: Testbed, models: Sequence[str], num_classes: int = DEFAULT_NUM_CLASSES,
                  tc_needed: bool = True, model_dir: str | None = None) -> tuple[list[dict[str, str]], list[str]]:
    """(table rows, problems) for every host of ``testbed`` (``model_dir``: a language model's
    folder, at the same path on every host)."""
    if not testbed.hosts:
        raise UsageError("no hosts to check: give them in .env (HOSTS=a,b or PI1_IP and PI2_IP/GPU_IP)")
    # Every host at once, beside this machine's own answer: each imports torch and builds the
    # models, which takes a Pi tens of seconds, and a lab of three took a minute host after host.
    with ThreadPoolExecutor(max_workers=len(testbed.hosts)) as pool:
        answers = [pool.submit(probe, host, models, num_classes, testbed.data_port, model_dir=model_dir)
                   for host in testbed.hosts]
        ref = reference(models, num_classes, model_dir)
        answers = [a.result() for a in answers]
    rows, problems = [], []
    for host, got in zip(testbed.hosts, answers):
        name = host.address
        row = {"host": name, "device": host.device}
        if "ssh_error" in got:
            row.update(ssh="FAIL")
            problems.append(f"{name}: not reachable over SSH as {host.target} ({got['ssh_error']}); check SSH_USER, "
                            f"SSH_KEY and that REMOTE_PYTHON ({host.remote_python}) runs the package in REMOTE_DIR "
                            f"({host.remote_dir}); --deploy ships it")
            rows.append(row)
            continue
        row["ssh"] = "ok"
        problems += _code_checks(name, got, ref, models, row)
        problems += _host_checks(host, got, ref, models, row, testbed.data_port, tc_needed)
        rows.append(row)
    return rows, problems


def _code_checks(name: str, got: dict[str, Any], ref: dict[str, Any], models: Sequence[str],
                 row: dict[str, str]) -> list[str]:
    """The code a host runs against this machine's: the source digest, torch, and each model's cuts."""
    problems: list[str] = []
    same_code = got.get("source_digest") == ref["source_digest"]
    row["commit"] = (got.get("git_commit") or "?")[:10]
    row["digest"] = "same" if same_code else got.get("source_digest", "?")
    if not same_code:  # an installed wheel has no commit; the digest is what runs
        problems.append(f"{name}: runs commit {got.get('git_commit')} (code digest {got.get('source_digest')}), "
                        f"this machine {ref['git_commit']} (digest {ref['source_digest']}); ship this tree with --deploy")
    row["torch"] = str(got.get("torch"))
    row["arch"] = str(got.get("machine", "?"))
    row["build"] = str(got.get("torch_build", "?"))
    warning = cuda_build_warning(name, got)
    if warning:
        log.warning("%s", warning)
    # The weights are numpy draws (the fingerprints compare them); what another torch version can
    # change is the traced graph, so a version differs harmlessly when every cut agrees.
    cuts = got.get("cut_digests") or {}
    split_apart = [m for m in models if cuts.get(m) != ref["cut_digests"].get(m)]
    if got.get("torch") != ref.get("torch") and split_apart:
        problems.append(f"{name}: torch {got.get('torch')}, this machine {ref.get('torch')}, and the cut points of "
                        f"{', '.join(split_apart)} differ with it: install the same torch and torchvision")
    return problems


def _host_checks(host: Host, got: dict[str, Any], ref: dict[str, Any], models: Sequence[str], row: dict[str, str],
                 data_port: int, tc_needed: bool) -> list[str]:
    """The weights' fingerprints, tc and root, the data port and the device a host was given."""
    name, problems = host.address, []
    prints = got.get("fingerprints") or {}
    bad = [m for m in models if prints.get(m) != ref["fingerprints"].get(m)]
    row["weights"] = "same" if not bad else "DIFFER"
    for m in bad:
        problems.append(f"{name}: weights of {m} have fingerprint {prints.get(m)}, this machine "
                        f"{ref['fingerprints'].get(m)}; check models/*.pth and --num-classes")
    row["tc"] = "ok" if got.get("tc") and got.get("ip") else "missing"
    if tc_needed and row["tc"] != "ok":
        problems.append(f"{name}: tc/ip not found; install iproute2 for --link tc")
    row["root"] = "root" if got.get("root") else ("sudo" if got.get("sudo") else "no")
    if tc_needed and row["root"] == "no":
        problems.append(f"{name}: {host.user or 'the SSH user'} is neither root nor allowed passwordless sudo; "
                        f"tc needs one of them")
    row["port"] = "free" if got.get("port_free") else "BUSY"
    if not got.get("port_free"):
        problems.append(f"{name}: the data port {data_port} is in use; stop what holds it or change PORT")
    row["cuda"] = "yes" if got.get("cuda_available") else "no"
    if not got.get("device_ok", True):
        problems.append(f"{name}: device {host.device} was asked for, but CUDA is not available there "
                        f"({got.get('cuda_devices', 0)} devices); use cpu or fix the driver")
    return problems


def format_checks(rows: Sequence[dict[str, str]]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, "-"))) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines += ["  ".join(str(r.get(c, "-")).ljust(widths[c]) for c in COLUMNS).rstrip() for r in rows]
    return "\n".join(lines)


# -- deploy ----------------------------------------------------------------------------------------
def tree_files(root: Path) -> list[Path]:
    """The files of the working tree to ship: what git tracks or would track (ignored files stay
    home); without git, the package, the scripts and the project files."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, timeout=30)
        if out.returncode == 0:
            return [root / f for f in out.stdout.decode().split("\0") if f and (root / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        pass
    files = [p for p in (root / "paretopipe").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return files + [p for p in root.glob("*") if p.is_file() and p.suffix in (".py", ".sh", ".toml", ".txt", ".md")]


def tarball(root: Path) -> bytes:
    """The working tree as a tar, with a stamp naming its commit and code digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in tree_files(root):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
        stamp = json.dumps({"commit": _git_commit(), "source_digest": source_digest()}).encode()
        info = tarfile.TarInfo(STAMP)
        info.size = len(stamp)
        tar.addfile(info, io.BytesIO(stamp))
    return buf.getvalue()


def deploy(host: Host, root: Path, timeout: float = 1800) -> str:
    """Ship the tree to ``host.remote_dir``; make a venv there unless ``remote_python`` runs the package.
    Returns the Python to use there."""
    data = tarball(root)
    line = f"mkdir -p {remote_path(host.remote_dir)} && tar -x -f - -C {remote_path(host.remote_dir)}"
    out = subprocess.run(host.ssh() + [line], input=data, capture_output=True, timeout=timeout)
    if out.returncode != 0:
        raise UsageError(f"deploy to {host.address} failed: {out.stderr.decode(errors='replace').strip()[-300:]}")
    check = f"cd {remote_path(host.remote_dir)} && {shlex.quote(host.remote_python)} -c 'import torch, paretopipe'"
    if subprocess.run(host.ssh() + [check], capture_output=True, timeout=120).returncode == 0:
        return host.remote_python
    venv = f"{host.remote_dir.rstrip('/')}/.venv"
    make = (f"cd {remote_path(host.remote_dir)} && python3 -m venv {remote_path(venv)} && "
            f"{remote_path(venv + '/bin/python')} -m pip install -q .")
    log.info("making a virtual environment on %s (torch comes from the host's package index)", host.address)
    out = subprocess.run(host.ssh() + [make], capture_output=True, timeout=timeout)
    if out.returncode != 0:
        raise UsageError(f"making a venv on {host.address} failed: {out.stderr.decode(errors='replace').strip()[-300:]}; "
                         f"install torch there first (Raspberry Pi: pip install torch --index-url "
                         f"https://download.pytorch.org/whl/cpu), then deploy again")
    return venv + "/bin/python"
