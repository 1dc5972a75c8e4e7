"""Faults applied to the stage processes of a local sweep (:mod:`paretopipe.faults`): stage 1's
worker signals stage 2's process as measured batch B starts (exactly then, on stage 1's clock), and
the sweep's controller starts a killed stage 2 again S seconds after it died."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from ..faults import Fault


def stage_signaller(pid: int, fault: Fault) -> Callable[[dict[str, Any]], None]:
    """Stage 1's hand on stage 2's process for ``fault``: SIGKILL, or SIGSTOP with SIGCONT
    ``fault.seconds`` later (a frozen process keeps its sockets: its peer sees silence, not EOF)."""
    def apply(_event: dict[str, Any]) -> None:
        if fault.kind == "kill":
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGSTOP)
        thaw = threading.Timer(fault.seconds, _continue, args=(pid,))
        thaw.daemon = True
        thaw.start()

    return apply


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


class Restarter:
    """Watches stage 2's process through one run; once it has died, waits out the fault's
    seconds from its death and calls ``restart`` (which starts a new stage 2 and connects it to
    stage 1's listener). ``error`` keeps a restart's failure for the controller to report."""

    def __init__(self, alive: Callable[[], bool], restart: Callable[[], None], seconds: float) -> None:
        self.alive, self.restart, self.seconds = alive, restart, seconds
        self.done = threading.Event()
        self.restarted = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="fault-restart", daemon=True)

    def __enter__(self) -> "Restarter":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self._thread.join()

    def _watch(self) -> None:
        while self.alive():
            if self.done.wait(0.01):
                return
        died = time.monotonic()
        if self.done.wait(max(0.0, died + self.seconds - time.monotonic())):
            return  # the run ended first: the sweep's retry starts fresh processes
        try:
            self.restart()
            self.restarted = True
        except BaseException as exc:  # reported by the controller after the run
            self.error = exc
