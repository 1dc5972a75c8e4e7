"""The one place that builds ssh command lines: keys only, never a password prompt."""

from __future__ import annotations


def ssh_argv(target: str, key: str | None = None, port: int | None = None,
             known_hosts: str | None = None) -> list[str]:
    """``ssh`` with batch mode (fails instead of asking for a password) and accept-new host keys."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=10"]
    if key:
        argv += ["-i", key]
    if port:
        argv += ["-p", str(port)]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return argv + [target]
