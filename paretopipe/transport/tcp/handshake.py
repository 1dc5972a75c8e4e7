"""The handshake of the data port: stage 1's listener (concurrent, bounded, authenticated; a
stranger is refused in one log line and the real peer is still served) and stage 2's half
(CHALLENGE, HELLO, HELLO_OK: drawn in the package's docstring)."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any

from ...errors import ParetoPipeError, PeerError, UsageError, WireError
from ...partition.stages import StageBuilder
from .. import aead, auth, wire
from .connection import Connection, is_loopback
from .messages import IDENTITY_FIELDS, Challenge, Hello, HelloOk, message

log = logging.getLogger("paretopipe.tcp")

HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING_HANDSHAKES = 32


def identity_of(builder: StageBuilder) -> dict[str, Any]:
    return {"model": builder.name, "fingerprint": builder.fingerprint, "num_classes": builder.num_classes,
            "wire_version": wire.VERSION}


class StageListener:
    """Stage 1's data port. Accepts concurrently: each connection gets one thread and one deadline
    for its whole handshake; a valid, authenticated stage 2 becomes the current connection (a newer one
    replaces an older one, so a restarted stage 2 reconnects). Strangers are refused and logged.

    At most MAX_PENDING_HANDSHAKES handshakes are under way at once; a new connection beyond that
    evicts the oldest, not itself. Silent connections (a slowloris) would otherwise hold every slot
    for the handshake timeout and shut out the real peer, whose handshake takes one round trip."""

    def __init__(self, sock: socket.socket, identity: dict[str, Any], secret: bytes | None = None,
                 max_payload: int = wire.DEFAULT_MAX_PAYLOAD, handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 encrypt: str = "none") -> None:
        try:
            self.encrypt = aead.check_choice(encrypt, secret)
        except UsageError:
            sock.close()
            raise
        self.aes = aead.has_aes_instructions()
        self.sock, self.identity, self.secret = sock, identity, secret
        self.max_payload, self.handshake_timeout = max_payload, handshake_timeout
        self.expected_cuts: list[str] | None = None
        self.refusals: list[str] = []
        self._connections: queue.Queue = queue.Queue()
        self._pending: dict[socket.socket, None] = {}  # in arrival order, oldest first
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        host = sock.getsockname()[0]
        if secret is None and not is_loopback(host):
            log.warning("stage 1 listens on %s without a shared secret: any host that reaches this port and "
                        "knows the model can connect; set %s in .env on both hosts", host, auth.SECRET_ENV)
        self._thread = threading.Thread(target=self._accept_loop, name="stage1-accept", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                # EMFILE/ENFILE: out of descriptors; the stalled ones time out, so wait and go on.
                log.warning("stage 1: accept failed (%s); retrying", exc)
                time.sleep(0.1)
                continue
            with self._pending_lock:
                oldest = next(iter(self._pending)) if len(self._pending) >= MAX_PENDING_HANDSHAKES else None
                if oldest is not None:
                    del self._pending[oldest]
                self._pending[conn] = None
            if oldest is not None:
                self._evict(oldest)
            threading.Thread(target=self._handshake, args=(conn, addr[0]), name="stage1-handshake",
                             daemon=True).start()

    def _evict(self, conn: socket.socket) -> None:
        """Wake the oldest handshake's thread with end of stream; it closes and logs the refusal."""
        self._refuse(f"a handshake evicted: more than {MAX_PENDING_HANDSHAKES} at once, the oldest goes")
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _refuse(self, why: str) -> None:
        self.refusals = (self.refusals + [why])[-20:]
        log.warning("stage 1: refused %s; still waiting for the legitimate peer", why)

    def _handshake(self, conn: socket.socket, address: str) -> None:
        deadline = time.monotonic() + self.handshake_timeout
        try:
            conn.settimeout(self.handshake_timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            mine = auth.nonce()
            wire.send_frame(conn, wire.CHALLENGE, meta={"nonce": mine, "auth": self.secret is not None,
                                                        "encrypt": self.encrypt, "aes": self.aes})
            hello = message(Hello, wire.expect(wire.recv_frame(conn, wire.MAX_META_BYTES, deadline=deadline),
                                                wire.HELLO).meta, "HELLO")
            problem = self._check(hello, mine)
            cipher = "none"
            if not problem:
                try:
                    cipher = aead.resolve(self.encrypt, self.aes, hello.encrypt, hello.aes)
                except WireError as exc:
                    problem = str(exc)
            if problem:
                try:
                    wire.send_frame(conn, wire.ERROR, meta={"reason": problem})
                except (ParetoPipeError, OSError):
                    pass
                raise PeerError(problem)
            mac = auth.proof(self.secret, "stage1", hello.nonce, mine, cipher_fields(cipher)) if self.secret else None
            wire.send_frame(conn, wire.HELLO_OK, meta={"mac": mac} if mac else None)
            channel = (aead.Channel.for_stage(1, cipher, self.secret, mine, hello.nonce)
                       if cipher != "none" and self.secret else None)
        except (ParetoPipeError, OSError) as exc:
            # The reason first: whoever sees the hang-up (the peer, a test) may read it at once.
            self._refuse(f"{address}: {exc}")
            conn.close()
            return
        finally:
            with self._pending_lock:
                self._pending.pop(conn, None)
        conn.settimeout(None)
        connection = Connection(conn, hello, address, self.max_payload, channel)
        connection.handshake_s = time.monotonic() - (deadline - self.handshake_timeout)
        self._connections.put(connection)

    def _check(self, hello: Hello, mine: str) -> str | None:
        diffs = [f"{k}: stage 1 has {self.identity[k]!r}, stage 2 has {str(getattr(hello, k))[:100]!r}"
                 for k in IDENTITY_FIELDS if self.identity[k] != getattr(hello, k)]
        cuts = self.expected_cuts
        if cuts is not None and hello.cuts is not None and list(hello.cuts) != list(cuts):
            diffs.append(f"cuts: stage 1 has {cuts!r}, stage 2 has {hello.cuts!r}")
        if diffs:
            return "handshake mismatch: " + "; ".join(diffs)
        if self.secret is None:
            return "stage 2 authenticates but stage 1 has no secret: set the same secret on both" if hello.mac else None
        if hello.mac is None:
            return "authentication required: stage 1 has a shared secret and stage 2 sent no proof"
        if not auth.check(self.secret, hello.mac, "stage2", mine, hello.nonce, hello.identity()):
            return "authentication failed: stage 2 does not know the shared secret"
        return None

    def connection(self, timeout: float, current: Connection | None = None) -> Connection:
        """The newest authenticated connection (``current`` if none newer arrived and it is open)."""
        newest = current if current is not None and not current.closed else None
        while True:
            try:
                candidate = (self._connections.get_nowait() if newest is not None
                             else self._connections.get(timeout=timeout))
            except queue.Empty:
                if newest is not None:
                    return newest
                last = self.refusals[-1] if self.refusals else "no peer connected"
                raise PeerError(f"no valid stage 2 connected within {timeout:g}s ({last})")
            if newest is not None and newest is not candidate:
                newest.close()
            newest = candidate

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        try:
            self.sock.close()
        except OSError:
            pass
        while not self._connections.empty():
            self._connections.get_nowait().close()


def cipher_fields(cipher: str) -> dict[str, Any] | None:
    """What stage 1's proof covers beyond the nonces: the cipher it settled on, when there is one."""
    return {"encrypt": cipher} if cipher != "none" else None


def open_connection(sock: socket.socket, builder: StageBuilder, *, cuts: list[str] | None = None,
                    secret: bytes | None = None, max_payload: int = wire.DEFAULT_MAX_PAYLOAD,
                    timeout: float = HANDSHAKE_TIMEOUT_S, encrypt: str = "none") -> Connection:
    """Stage 2's half of the handshake over a connected socket (``cuts``: what this side insists on;
    ``encrypt``: the cipher it asks for, see :mod:`paretopipe.transport.aead`)."""
    aead.check_choice(encrypt, secret)
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    try:
        challenge = message(Challenge, wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES, deadline=deadline),
                                                    wire.CHALLENGE).meta, "CHALLENGE")
        if secret is not None and not challenge.auth:
            raise PeerError("stage 1 does not authenticate (it has no shared secret); refusing to send it data")
        aes = aead.has_aes_instructions()
        try:
            cipher = aead.resolve(challenge.encrypt, challenge.aes, encrypt, aes)
        except WireError as exc:
            raise PeerError(str(exc))
        mine = auth.nonce()
        ident = identity_of(builder)
        hello = {**ident, "nonce": mine, "cuts": cuts}
        if encrypt != "none":
            hello.update(encrypt=encrypt, aes=aes)
        if secret is not None:
            hello["mac"] = auth.proof(secret, "stage2", challenge.nonce, mine,
                                      {**ident, **({"encrypt": encrypt, "aes": aes} if encrypt != "none" else {})})
        wire.send_frame(sock, wire.HELLO, meta=hello)
        ok = message(HelloOk, wire.expect(wire.recv_frame(sock, wire.MAX_META_BYTES, deadline=deadline),
                                           wire.HELLO_OK).meta, "HELLO_OK")
    except PeerError as exc:
        sock.close()
        raise PeerError(f"stage 1 refused the handshake: {exc}".replace("peer reported: ", ""))
    except (WireError, OSError) as exc:
        sock.close()
        raise PeerError(f"handshake with stage 1 failed: {exc}")
    if secret is not None and not auth.check(secret, ok.mac, "stage1", mine, challenge.nonce, cipher_fields(cipher)):
        sock.close()
        raise PeerError("authentication failed: stage 1 does not know the shared secret"
                        + (f" or did not settle on {cipher}" if cipher != "none" else ""))
    sock.settimeout(None)
    channel = aead.Channel.for_stage(2, cipher, secret, challenge.nonce, mine) if cipher != "none" and secret else None
    connection = Connection(sock, None, "stage 1", max_payload, channel)
    connection.handshake_s = time.monotonic() - (deadline - timeout)
    return connection
