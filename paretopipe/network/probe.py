"""Measure a link for real: TCP round-trip time and goodput in both directions (``measure``/``serve``).

The protocol is one ASCII command line per connection, at most 64 bytes, parsed strictly:
``PING`` (echo single bytes), ``SINK n`` (read n bytes, then answer ``OK``), ``SOURCE n`` (send
n bytes). n is capped at 1 GiB. Nothing received is evaluated.
"""

from __future__ import annotations

import errno
import socket
import statistics
import threading
import time
from typing import Any

from ..errors import PeerError, UsageError

MAX_LINE = 64
COMMAND_TIMEOUT_S = 5.0
MAX_TRANSFER = 1 << 30
CHUNK = 1 << 16


def _readline(conn: socket.socket, deadline: float) -> tuple[str, bytes]:
    """The command line (at most 64 bytes, within the deadline) and any bytes that followed it."""
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError("no command line in time")
        conn.settimeout(remaining)
        chunk = conn.recv(MAX_LINE + 1 - len(buf))
        if not chunk:
            raise PeerError("peer closed before sending a command")
        buf += chunk
        if len(buf) > MAX_LINE and b"\n" not in buf:
            raise PeerError("command line too long")
    line, _, rest = buf.partition(b"\n")
    return line.decode("ascii", "replace").strip(), rest


def _handle(conn: socket.socket, slots: threading.BoundedSemaphore) -> None:
    try:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                line, rest = _readline(conn, time.monotonic() + COMMAND_TIMEOUT_S)
                conn.settimeout(60)
                words = line.split()
                if words == ["PING"]:
                    if rest:
                        conn.sendall(rest)
                    while True:
                        b = conn.recv(1)
                        if not b:
                            return
                        conn.sendall(b)
                if len(words) == 2 and words[0] in ("SINK", "SOURCE") and words[1].isdigit() and len(words[1]) < 12:
                    n = int(words[1])
                    if n > MAX_TRANSFER:
                        return
                    if words[0] == "SINK":
                        buf = bytearray(CHUNK)
                        got = len(rest)
                        while got < n:
                            k = conn.recv_into(buf, min(CHUNK, n - got))
                            if not k:
                                return
                            got += k
                        conn.sendall(b"OK\n")
                    else:
                        block = bytes(CHUNK)
                        sent = 0
                        while sent < n:
                            sent += conn.send(block[: min(CHUNK, n - sent)])
            except (OSError, PeerError):
                return
    finally:
        slots.release()


def serve(host: str = "0.0.0.0", port: int = 5201, max_clients: int = 64,
          ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
    """Answer measure clients until Ctrl-C (or ``stop``): at most ``max_clients`` at once, each with
    a thread; more wait in the kernel's backlog, and running out of descriptors (EMFILE) only
    pauses accepting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    slots = threading.BoundedSemaphore(max_clients)
    with socket.socket(family, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((host, port))
        except (OSError, OverflowError) as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}")
        srv.listen(128)
        srv.settimeout(0.2)
        if ready is not None:
            ready.set()
        while stop is None or not stop.is_set():
            if not slots.acquire(timeout=0.2):
                continue  # every slot busy: leave the rest in the backlog
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                slots.release()
                continue
            except OSError as exc:  # EMFILE/ENFILE: wait for descriptors to come back
                slots.release()
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)
                    continue
                raise
            threading.Thread(target=_handle, args=(conn, slots), daemon=True).start()


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise PeerError(f"cannot reach {host}:{port} ({exc}); is 'network_delay.py serve' running there?")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def measure(host: str, port: int = 5201, rtt_samples: int = 20, nbytes: int = 2_000_000,
            timeout: float = 60.0) -> dict[str, Any]:
    """RTT (median/p95 over ``rtt_samples`` TCP round trips) and goodput each way, in Mbit/s."""
    with _connect(host, port, timeout) as sock:
        sock.sendall(b"PING\n")
        rtts = []
        for _ in range(rtt_samples):
            t0 = time.monotonic()
            sock.sendall(b"x")
            if sock.recv(1) != b"x":
                raise PeerError("echo mismatch")
            rtts.append(time.monotonic() - t0)
    rtts.sort()
    rtt_median = statistics.median(rtts)

    with _connect(host, port, timeout) as sock:
        sock.sendall(f"SINK {nbytes}\n".encode())
        block = bytes(CHUNK)
        t0 = time.monotonic()
        sent = 0
        while sent < nbytes:
            sent += sock.send(block[: min(CHUNK, nbytes - sent)])
        if sock.recv(3) != b"OK\n":
            raise PeerError("upload not acknowledged")
        up_s = time.monotonic() - t0

    with _connect(host, port, timeout) as sock:
        t0 = time.monotonic()
        sock.sendall(f"SOURCE {nbytes}\n".encode())
        buf = bytearray(CHUNK)
        got = 0
        while got < nbytes:
            k = sock.recv_into(buf)
            if not k:
                raise PeerError("download cut short")
            got += k
        down_s = time.monotonic() - t0

    # A transfer's clock runs from the first byte sent to the last byte acknowledged (upload) or
    # received (download): one RTT of that is the path, not the rate, so it is taken off.
    def goodput(seconds: float) -> float:
        return nbytes * 8 / max(seconds - rtt_median, 1e-9) / 1e6

    return {"host": host, "port": port, "rtt_samples": rtt_samples,
            "rtt_median_ms": rtt_median * 1e3, "rtt_p95_ms": rtts[min(len(rtts) - 1, int(0.95 * len(rtts)))] * 1e3,
            "transfer_bytes": nbytes, "upload_s": up_s, "download_s": down_s,
            "upload_goodput_mbit_per_s": goodput(up_s), "download_goodput_mbit_per_s": goodput(down_s),
            "note": "goodput = bytes*8 / (transfer time - median RTT); TCP payload only"}
