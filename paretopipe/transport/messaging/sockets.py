"""The plain TCP sockets under every data-port protocol: one that listens, and one that connects,
retrying until a deadline because either stage may start first."""

from __future__ import annotations

import socket
import time

from ...errors import PeerError, UsageError


def listen(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 0..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc} "
                         f"(is another run using the port?)")
    sock.listen(64)
    return sock


def connect_with_retry(host: str, port: int, connect_timeout: float) -> socket.socket:
    """Connect, retrying until ``connect_timeout``: either side may start first."""
    if not 0 < port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 1..65535")
    deadline = time.monotonic() + connect_timeout
    last: Exception | None = None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=min(5.0, max(0.1, connect_timeout)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise PeerError(f"could not connect to {host}:{port} within {connect_timeout:g}s "
                            f"({last}); is stage 1 (partition1.py) running and reachable?")
        time.sleep(0.2)
