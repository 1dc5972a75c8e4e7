"""A lab's daemons (sshd, a broker) found by the lab's marker in their command line, stopped and
waited for: ``lab down`` ends what this lab started, a half-made lab's too, and never anyone
else's process."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from .zygote_server import DAEMON_MARK


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def is_marked(pid: int | str, program: bytes, marker: bytes) -> bool:
    """Whether ``pid`` runs ``program`` started with one of this lab's files (``marker``)."""
    line = _cmdline(Path(f"/proc/{pid}"))
    return program in line.split(b" ")[0] and marker in line


def stop_marked(program: bytes, marker: bytes, known: list[int]) -> list[str]:
    """SIGTERM to the ``known`` PIDs, and to any ``program`` started with one of this lab's files
    (``marker``: a half-made lab's last one), never to someone else's process; returns once they
    are gone (:func:`wait_gone`)."""
    pids = set(known) | {int(p.name) for p in Path("/proc").iterdir()
                         if p.name.isdigit() and is_marked(p.name, program, marker)}
    signalled = []
    for pid in sorted(pids):
        if is_marked(pid, program, marker):
            try:
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
            except ProcessLookupError:
                pass
    wait_gone(program, marker, signalled)
    return [f"{program.decode()} {pid}" for pid in signalled]


def wait_gone(program: bytes, marker: bytes, pids: list[int], timeout: float = 5.0) -> None:
    """Return once the stopped processes are gone (a broker under load takes its time to end), and
    SIGKILL what is still there after ``timeout``: a lab that is down holds nothing."""
    def alive() -> list[int]:
        return [pid for pid in pids if is_marked(pid, program, marker)]

    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_zygote_daemons(namespaces: list[str]) -> list[str]:
    """SIGKILL each zygote daemon (and the forks serving its connections) in these network
    namespaces: started by a stage's SSH session, it would outlive the lab by its idle time. It
    holds nothing a kill loses."""
    inodes = set()
    for ns in namespaces:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
    killed = []
    for proc in Path("/proc").iterdir():
        line = _cmdline(proc) if proc.name.isdigit() else b""
        if DAEMON_MARK.encode() not in line:
            continue
        with contextlib.suppress(OSError):
            if os.stat(proc / "ns" / "net").st_ino in inodes:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(f"zygote daemon {proc.name}")
    return killed
