"""The one place that builds ssh command lines: keys only, never a password prompt, never an option
smuggled in through a user or host name."""

from __future__ import annotations

import re
import shlex

from .errors import UsageError

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
    return argv + ["--", target]


def remote_path(path: str) -> str:
    """A path for a remote shell line: quoted, except a leading ``~/``, which the remote shell expands."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)
