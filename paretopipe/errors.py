"""Project exceptions: every user-facing failure carries a message a user can act on."""

from __future__ import annotations


class ParetoPipeError(Exception):
    """Base class. CLIs print the message on one line and exit with ``exit_code``."""

    exit_code = 1


class UsageError(ParetoPipeError):
    """Bad input from the user: unknown model, split out of range, bad units, ..."""

    exit_code = 2


class WireError(ParetoPipeError):
    """A frame broke the wire format's rules; the connection must be closed."""


class PeerError(ParetoPipeError):
    """The peer died, closed the connection, timed out or refused the handshake."""


class InfeasibleRun(ParetoPipeError):
    """A batch took longer than the deadline the user set (``--max-batch-s``): a measured outcome
    of the configuration, recorded with ``status: infeasible``, not a failure of the run."""


class NetemError(ParetoPipeError):
    """A tc/ip command failed or the kernel lacks what a profile needs."""
