"""Labs of namespace hosts for the tests: made per test, torn down after it, and checked to leave
nothing behind (no namespace, link, sshd, qdisc or stage process)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from conftest import PYTHON, ROOT, is_root


def _why_no_lab() -> str | None:
    if not is_root():
        return "a lab needs root (network namespaces, a bridge, sshd)"
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs iproute2 and openssh as root)"
    if not any(Path(p).exists() for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd")):
        return "openssh-server is not installed (make test installs it as root)"
    # Per process: two pytest-xdist workers probing under one name raced, and the loser skipped
    # every lab test it held with "File exists".
    name = f"ppprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None if probe.returncode == 0 else f"cannot create network namespaces: {probe.stderr.strip()}"


LAB_SKIP = _why_no_lab()


def leftovers(name: str) -> list[str]:
    """What a lab called ``name`` (or the stages it ran) left on this machine."""
    found = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"namespace {line.split()[0]}" for line in namespaces.splitlines() if line.startswith(f"{name}-h")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines()
              if line.split(":")[1].strip().startswith((f"{name}-br", f"{name}h"))]
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        # The folder's name ends in a slash: lab "ppls" is not lab "pplsa" (whose remote workers'
        # ssh command lines a check without it took for this lab's leftovers).
        if f"paretopipe-lab-{name}/" in cmd:
            found.append(f"process {proc.pid}: {cmd[:80]}")
    if Path(f"/tmp/paretopipe-lab-{name}").exists():
        found.append(f"folder /tmp/paretopipe-lab-{name}")
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):  # a host's CPU share (--host-cpu)
        found += [f"cgroup {g}" for g in root.glob(f"paretopipe-lab-{name}-h*")]
    return found


def _net_namespace(pid: int | str) -> str | None:
    """The network namespace a process runs in (``net:[inode]``), or None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _lab_namespaces(made) -> set[str]:
    """The ``net:[inode]`` of each of this lab's hosts: other labs (other tests running beside this
    one under pytest-xdist) are theirs to check."""
    found = set()
    for i in range(1, made.hosts + 1):
        with contextlib.suppress(OSError):
            found.add(f"net:[{os.stat(f'/run/netns/{made.namespace(i)}').st_ino}]")
    return found


@contextlib.contextmanager
def lab(name: str, hosts: int = 2, subnet: int = 50, arches: list[str] | None = None,
        broker: int | None = None, cpu: list[float | None] | None = None) -> Iterator:
    """A lab for one test (or one module); afterwards nothing of it may remain. ``broker``: the
    host that runs the lab's Mosquitto; ``cpu``: each host's CPU share."""
    if LAB_SKIP:
        pytest.skip(LAB_SKIP)
    from paretopipe.controller import lab as labs

    made = labs.up(name, hosts, subnet, arches=arches, broker=broker, cpu=cpu)
    namespaces = _lab_namespaces(made)
    try:
        yield made
    finally:
        labs.down(name)
        programs = ("paretopipe.controller.worker", "paretopipe.controller.rpc_ranks", "paretopipe.controller.llamacpp_worker",
                    "llama-server", "ggml-rpc-server")
        stages = [p for p in psutil.process_iter(["cmdline"])
                  if any(m in " ".join(p.info["cmdline"] or []) for m in programs)
                  and _net_namespace(p.pid) in namespaces]
        for p in stages:  # a stage a failed test could not stop: kill it, and fail below
            p.kill()
        left = leftovers(name) + [f"stage process {p.pid}" for p in stages]
        assert not left, f"the lab left things behind: {left}"


def in_host(made, i: int, *argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command inside lab host ``i``'s namespace (as its sshd's sessions would)."""
    return subprocess.run(["ip", "netns", "exec", made.namespace(i), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=check)


def serve_probe(made, i: int, port: int) -> subprocess.Popen:
    """``network_delay.py serve`` inside host ``i``, ready when it returns."""
    proc = subprocess.Popen(["ip", "netns", "exec", made.namespace(i), PYTHON, "network_delay.py", "serve", "--host",
                             made.address(i), "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    proc.stdout.readline()  # it prints once it listens
    return proc


def measure(made, i: int, j: int, port: int, nbytes: int = 4_000_000) -> dict:
    """``network_delay.py measure`` from host ``i`` to a probe server on host ``j``."""
    import json

    out = in_host(made, i, PYTHON, "network_delay.py", "measure", "--host", made.address(j), "--port", str(port),
                  "--bytes", str(nbytes), "--quiet")
    return json.loads(out.stdout)
