"""The next stage as stage 1 sees it: the connection and its ordered sender, a thread reading what
comes back, the RUN that starts a run there, and which segments to ask it to re-time."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink, Outage
from .. import wire
from ..runconfig import RunConfig
from .connection import Connection, FrameSender
from .messages import RunStart


class NextStage:
    """The next stage as stage 1 sees it: the connection, its ordered sender, the cuts it runs,
    and a thread that reads what comes back. A streaming run hands each result to ``on_result``
    the moment it lands; otherwise every frame (and the reason reading ended) waits in ``inbox``."""

    def __init__(self, connection: Connection, link: EmulatedLink | None, cuts: list[str],
                 on_result: Callable[[wire.Frame, float], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None, outage: Outage | None = None) -> None:
        self.connection, self.cuts = connection, list(cuts)
        self.positions: dict[int, int] = {}  # a generation's stream -> positions sent it (its caches hold)
        self.outage = outage  # a link that is down carries nothing either way (faults' link:down)
        self.sender = FrameSender(connection.writer, link, "stage1-send", outage)
        self.inbox: queue.Queue = queue.Queue()
        self.on_result, self.on_error = on_result, on_error
        self.reader = threading.Thread(target=self._read, name="stage1-recv", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while True:
                f = self.connection.reader.read()
                if self.outage is not None:
                    self.outage.wait()
                now = time.monotonic()
                if self.on_result is not None and f.kind != wire.RECORDS:
                    self.on_result(wire.expect(f, wire.RESULT), now)
                    continue
                self.inbox.put((f, now))
                if f.kind == wire.RECORDS:
                    return
        except BaseException as exc:
            self.inbox.put((exc, time.monotonic()))
            if self.on_error is not None:
                self.on_error(exc)

    def await_frame(self, kind: int, seq: int, deadline: float,
                    late: Callable[[], None] = lambda: None) -> tuple[wire.Frame | None, float, str | None]:
        """The next ``kind`` frame for ``seq``: (frame, arrival, None), or (None, when, why). An
        earlier batch's result (after its deadline) is released, and ``late`` counts it."""
        while True:
            try:
                item, arrived = self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None, time.monotonic(), "deadline"
            if isinstance(item, BaseException):
                return None, arrived, f"{type(item).__name__}: {item}"
            if item.kind not in (wire.RESULT, wire.PROBE_ACK, wire.RECORDS):
                item.release()
                return None, arrived, f"unexpected {wire.KIND_NAMES.get(item.kind, item.kind)} frame"
            if item.kind == kind and item.seq == seq:
                return item, arrived, None
            if item.kind == wire.RESULT:
                late()
            item.release()

    def close(self, bye: bool = False) -> None:
        self.sender.close(timeout=1.0)
        self.connection.close(bye=bye)


def run_start(run_id: str, cfg: RunConfig, link_manifest: dict[str, Any],
              conditions: NetworkConditions | None) -> RunStart:
    """Stage 1's RUN for stage 2 (the one type both write and read): ``conditions`` when the link
    is emulated (each hop's frames take the up direction, the results on their way back the
    down). A middle stage passes it on with the next stage's number."""
    chain = len(cfg.cuts) > 1  # a chain: the receiving stage's place and its own forward direction
    return RunStart(run_id=run_id, config=cfg.to_dict(), link=link_manifest,
                    return_link=conditions.down.to_dict() if conditions else None,
                    forward_link=conditions.up.to_dict() if conditions and chain else None)


def consecutive(due: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Segments to re-time, in runs of consecutive indices (each run is timed as one chain)."""
    runs: list[list[tuple[int, str]]] = []
    for item in sorted(due):
        if runs and item[0] == runs[-1][-1][0] + 1:
            runs[-1].append(item)
        elif not (runs and item[0] == runs[-1][-1][0]):
            runs.append([item])
    return runs
