"""Faults applied to a sweep's stage processes (:mod:`paretopipe.faults`), here or on hosts over
SSH. Stage 1's worker asks as measured batch B starts (:func:`ask_the_sweep`: one ``fault`` event,
then it waits for the answer on its stdin), the sweep's controller signals stage 2's process by
the PID it reported (:class:`StageFault`), or takes down the link that tc shapes on the hosts
(:class:`LinkFault`), and answers, so the fault is in place before batch B goes on; a killed stage 2
is started again S seconds after it died."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import PeerError
from ..faults import Fault
from .commands import emit

if TYPE_CHECKING:  # the controller's side only: a stage worker never holds one
    from ..network.linkdown import LinkDown
    from .hosts import StageProcess

APPLIED = "fault_applied"


def ask_the_sweep(event: dict[str, Any]) -> None:
    """Stage 1's ``on_fault`` in a sweep's worker: the event, then the sweep's answer (one JSON
    line on stdin, read here because the command loop waits for this run)."""
    emit({"event": "fault", **event})
    line = sys.stdin.readline()
    try:
        answer = json.loads(line) if line.strip() else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("cmd") != APPLIED:
        raise PeerError(f"the sweep did not apply {event.get('fault')}: it answered {line.strip()[:80]!r}")
    if answer.get("error"):
        raise PeerError(f"the sweep could not apply {event.get('fault')}: {str(answer['error'])[:200]}")


class _TimedFault:
    """A fault the controller applies and ends on a thread of its own: leaving the block ends the
    wait and joins it; ``error`` keeps what went wrong there."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "_TimedFault":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join()

    def _start(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name="stage-fault", daemon=True)
        thread.start()
        self._threads.append(thread)


class LinkFault(_TimedFault):
    """``link:down`` on a link tc shapes: :meth:`apply` takes it down on every host (the queue of no
    room, :mod:`paretopipe.network.linkdown`) and brings it up ``seconds`` later, or when the block
    ends first."""

    def __init__(self, fault: Fault, link: "LinkDown | None") -> None:
        super().__init__(fault)
        self.link = link

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._up()

    def apply(self) -> None:
        if self.link is None:
            raise PeerError(f"--fault {self.fault.label}: no link is shaped here to take down (--link tc with a network)")
        try:
            self.link.down()
        except BaseException as exc:
            self._up()
            raise PeerError(f"tc could not take the link down: {exc}") from exc
        self._start(self._up_later)

    def _up_later(self) -> None:
        self.done.wait(self.fault.seconds)
        self._up()

    def _up(self) -> None:
        if self.link is None:
            return
        try:
            self.link.up()
        except BaseException as exc:  # reported by the controller after the run
            self.error = self.error or exc


class StageFault(_TimedFault):
    """The controller's side of one run's fault on stage 2: :meth:`apply` signals it (SIGKILL, or
    SIGSTOP with SIGCONT ``seconds`` later); after a kill, ``restart`` is called ``seconds`` after
    the process died. Leaving the block continues a stage still stopped and waits for a restart
    under way; ``error`` keeps a restart's failure."""

    def __init__(self, fault: Fault, stage2: "StageProcess", restart: Callable[[], None]) -> None:
        super().__init__(fault)
        self.stage2, self.restart = stage2, restart
        self._stopped = False

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._stopped:
            self._continue()

    def apply(self) -> None:
        if self.fault.kind == "kill":
            self.stage2.signal("KILL")
            self._start(self._restart_when_dead)
        else:
            self.stage2.signal("STOP")
            self._stopped = True
            self._start(self._thaw)

    def _thaw(self) -> None:
        self.done.wait(self.fault.seconds)
        self._continue()

    def _continue(self) -> None:
        if self._stopped:
            self._stopped = False
            try:
                self.stage2.signal("CONT")
            except PeerError as exc:
                self.error = self.error or exc

    def _restart_when_dead(self) -> None:
        while self.stage2.alive():
            if self.done.wait(0.01):
                return
        died = time.monotonic()
        if self.done.wait(max(0.0, died + self.fault.seconds - time.monotonic())):
            return  # the run ended first: the sweep's retry starts fresh processes
        try:
            self.restart()
        except BaseException as exc:  # reported by the controller after the run
            self.error = exc
