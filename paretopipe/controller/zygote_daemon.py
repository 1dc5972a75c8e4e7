"""A stage process started over SSH, forked from its host's zygote daemon instead of a new interpreter.

    python -m paretopipe.controller.zygote_daemon MODULE [ARGS...]

runs ``python -m MODULE ARGS`` as a fork of a daemon that has imported torch, torchvision and the
stage code once (:func:`paretopipe.controller.zygote_server.listen`). A stage worker's start over SSH
cost 1.6 s (a language model) to 3.2 s (a CNN) of CPU on a 2-core x86 VM, most of it imports, and
several times that on a Pi; a sweep starts one per stage for every model and placement, and again
after every failure.

The fork gets this process's own stdin, stdout and stderr (the SSH session's), its environment and
working directory, so the sweep speaks to it exactly as to a process SSH started; it reports its own
pid, by which the sweep signals it. This process stays as its stand-in for SSH: a signal it gets
(TERM, INT, HUP) goes to the stage, and it exits with the stage's status, or dies of the stage's
signal. Its title names it ``paretopipe zygote attach``, never the stage's module, so that nothing
looking for the stage by its command line takes this process for it.

The daemon is one per user, interpreter, package tree (its files' sizes and times) and start-up
variables (the ones read once, at start: ``zygote.STARTUP_PREFIXES``), named by a hash of them on an
abstract unix socket, which belongs to the host's network namespace and needs no file; it serves
only its own user (SO_PEERCRED) and exits after ``zygote_server.IDLE_S`` without a connection.
Anything that keeps a fork from being had (``PARETOPIPE_NO_ZYGOTE=1``, a daemon that cannot start)
gives the plain start: this process becomes ``python -m MODULE ARGS`` by exec.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from . import zygote
from ..sourcefiles import source_files

ATTACH = "paretopipe.controller.zygote_daemon"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def daemon_name(env: dict[str, str] | None = None) -> str:
    """The daemon for this user, interpreter, package tree and start-up variables."""
    env = dict(os.environ if env is None else env)
    package = Path(zygote.__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for part in (sys.executable, str(package), *sorted(f"{k}={v}" for k, v in zygote.startup_env(env).items())):
        digest.update(part.encode(errors="surrogateescape") + b"\0")
    for path in source_files(package):  # a changed or shipped tree is another daemon's
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return f"paretopipe-zygote-{os.getuid()}-{digest.hexdigest()[:16]}"


def fork_from_daemon(module: str, args: Sequence[str]) -> zygote.ForkedProcess | None:
    """``python -m module args`` forked from this host's daemon on our stdio, or None where it cannot be."""
    if not zygote.enabled():
        return None
    env = dict(os.environ)
    daemon = zygote.Zygote(zygote.PRELOAD, env=env, daemon=daemon_name(env))
    try:
        return daemon.spawn(module, list(args), env, cwd=os.getcwd(), stdio=(0, 1, 2))
    except OSError:
        daemon.close()
        return None


def _hold_signals() -> list[int]:
    """Keep the forwarded signals that come before the stage exists: the stage reports its pid on
    our stdout as soon as it is forked, so the sweep may signal us before the spawn has returned."""
    held: list[int] = []
    for sig in FORWARDED:
        signal.signal(sig, lambda num, frame: held.append(num))
    return held


def _stand_in(child: zygote.ForkedProcess, held: list[int]) -> int:
    """Forward signals to the stage (those held first) and wait for it; its exit status, or minus its signal."""
    for sig in FORWARDED:
        signal.signal(sig, lambda num, frame: child.send_signal(num))
    for sig in held:
        child.send_signal(sig)
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m {ATTACH} MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, args = argv[0], argv[1:]
    held = _hold_signals()
    zygote.set_title("paretopipe zygote attach")  # before the stage exists, so that it is never taken for it
    child = fork_from_daemon(module, args)
    if child is None:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        if held:  # what the stage would have died of
            os.kill(os.getpid(), held[0])
        os.execv(sys.executable, [sys.executable, "-m", module, *args])
    zygote.set_title(f"paretopipe zygote attach (pid {child.pid})")
    code = _stand_in(child, held)
    if code < 0:  # die as the stage did, so that SSH reports the same signal
        if -code in FORWARDED:  # our handler for it would forward it again
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
