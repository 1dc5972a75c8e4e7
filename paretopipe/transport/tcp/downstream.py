"""A middle stage's way to the next stage of a TCP chain (Pi -> Pi -> server)."""

from __future__ import annotations

from ...errors import UsageError
from .connection import Connection
from .handshake import StageListener


class Downstream:
    """A middle stage's way to the next stage: the listener the next stage connects to, and the
    connection it keeps across runs (as stage 1 keeps its own), ended with BYE when upstream ends."""

    def __init__(self, listener: StageListener, connect_timeout: float = 60.0) -> None:
        self.listener, self.connect_timeout = listener, connect_timeout
        self.connection: Connection | None = None

    def connect(self, cuts: list[str]) -> Connection:
        """The newest authenticated next stage (the current one if none newer came), whose cuts fit:
        a next stage may connect before the first RUN says what the plan is, so what it insisted on
        in its HELLO is checked here, not only by the listener."""
        self.listener.expected_cuts = list(cuts)
        self.connection = self.listener.connection(self.connect_timeout, current=self.connection)
        insisted = self.connection.peer.cuts if self.connection.peer is not None else None
        if insisted is not None and list(insisted) != list(cuts):
            self.connection.close()
            self.connection = None
            raise UsageError(f"the next stage insists on cuts {list(insisted)!r}, the plan has {list(cuts)!r}")
        return self.connection

    def close(self, bye: bool) -> None:
        if self.connection is not None:
            self.connection.close(bye=bye)
