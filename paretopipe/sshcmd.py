"""The one place that builds ssh command lines: keys only, never a password prompt, never an option
smuggled in through a user or host name."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import tempfile

from .errors import UsageError

#: ssh's connection sharing (``ControlMaster``): the first command to a host opens one
#: authenticated connection, and the next ones ride it. A sweep runs tens of short commands on
#: each host per configuration (tc, ip, kill, its checks), each a key exchange otherwise: 0.16 s of
#: this side's CPU on a 2-core x86 VM, more on a Pi, and round trips on a slow link. The connection
#: closes itself ``PERSIST_S`` after its last command (or with its server); ``SHARE_ENV=0`` turns
#: sharing off.
SHARE_ENV = "PARETOPIPE_SSH_SHARE"
PERSIST_S = 30

_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$")
_IP = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f:]+(?:%[A-Za-z0-9_.-]+)?)$")


def check_host(host: str, what: str = "host") -> str:
    """A host name or an IP address: letters, digits, dots, dashes and colons, never starting with
    a dash (ssh would read it as an option)."""
    if not isinstance(host, str) or not (_IP.match(host) or _HOSTNAME.match(host)):
        raise UsageError(f"{what} {str(host)[:60]!r} is not a host name or an IP address")
    return host


def check_user(user: str, what: str = "SSH_USER") -> str:
    if not isinstance(user, str) or not _USER.match(user):
        raise UsageError(f"{what}={str(user)[:40]!r} is not a user name (letters, digits, . _ -, not starting with -)")
    return user


def split_target(target: str) -> tuple[str | None, str]:
    user, sep, host = target.rpartition("@")
    return (check_user(user, "user") if sep else None), check_host(host)


def ssh_argv(target: str, key: str | None = None, port: int | None = None,
             known_hosts: str | None = None) -> list[str]:
    """``ssh`` in batch mode (fails instead of asking for a password), accept-new host keys, and
    ``--`` before the checked ``[user@]host``, so nothing after it is read as an option."""
    split_target(target)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if key:
        argv += ["-i", key]
    if port:
        if not 0 < int(port) < 65536:
            raise UsageError(f"SSH_PORT={port!r} is not a TCP port (1..65535)")
        argv += ["-p", str(int(port))]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    shared = control_path(target, key, port, known_hosts)
    if shared:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={shared}", "-o", f"ControlPersist={PERSIST_S}"]
    return argv + ["--", target]


def _share_folder() -> str | None:
    """This user's folder of shared connections' sockets (0700, its own), or None: sharing off, or
    the folder is not this user's alone (then another user could reach its connections)."""
    if os.environ.get(SHARE_ENV, "1").strip().lower() in ("0", "no", "off", "false"):
        return None
    folder = os.path.join(tempfile.gettempdir(), f"paretopipe-ssh-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077 or "%" in folder:
        return None
    return folder


def control_path(target: str, key: str | None = None, port: int | None = None,
                 known_hosts: str | None = None) -> str | None:
    """Where the shared connection to ``target`` with this key, port and known hosts listens (a
    digest of the four: another key or host file never rides a connection it did not open)."""
    folder = _share_folder()
    if folder is None:
        return None
    norm = [os.path.abspath(p) if p else None for p in (key, known_hosts)]
    digest = hashlib.sha256(json.dumps([target, int(port or 22), *norm]).encode()).hexdigest()[:24]
    return os.path.join(folder, digest)


def close_shared(target: str, key: str | None = None, port: int | None = None,
                 known_hosts: str | None = None) -> bool:
    """End the shared connection to ``target``, if one is open (a lab going down: its next lab may
    reuse the address). True when one was open."""
    path = control_path(target, key, port, known_hosts)
    if not path or not os.path.exists(path):
        return False
    try:
        out = subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "--", target], capture_output=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def remote_path(path: str) -> str:
    """A path for a remote shell line: quoted, except a leading ``~/``, which the remote shell expands."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)
