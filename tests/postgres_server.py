"""A real PostgreSQL server for a test: Debian's binaries (installed by ``make``), a cluster made
by ``initdb`` in a temporary folder, listening on 127.0.0.1 only, with password authentication,
stopped and removed afterwards. PostgreSQL refuses to run as root, so as root the cluster belongs
to the ``postgres`` user the package creates."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

USER = "paretopipe"


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres(tmp: Path) -> Iterator[tuple[str, str]]:
    """(a URL with the password, the password) of a fresh server and its ``postgres`` database."""
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (make installs Debian's postgresql package)")
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to own the test cluster")
    folder = tmp / "pg"
    folder.mkdir()
    password = secrets.token_hex(12)
    (folder / "pw").write_text(password + "\n")
    if owner is not None:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        os.chown(folder / "pw", owner.pw_uid, owner.pw_gid)
        # The folders above it must be enterable by that user.
        for parent in folder.parents:
            if str(parent).startswith(str(tmp.anchor)) and parent != Path(tmp.anchor):
                parent.chmod(parent.stat().st_mode | 0o011)
    as_owner = ["runuser", "-u", "postgres", "--"] if owner is not None else []
    data, port = folder / "data", _free_port()

    def run(*cmd: str) -> None:
        done = subprocess.run(as_owner + list(cmd), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])}: {done.stderr.strip() or done.stdout.strip()}")

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={folder / 'pw'}", "--auth=scram-sha-256",
        "--no-sync", "-E", "UTF8")
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "60", "-o",
        f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off", "start")
    try:
        yield f"postgresql://{USER}:{password}@127.0.0.1:{port}/postgres", password
    finally:
        subprocess.run(as_owner + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
