"""``paretopipe watch``'s server: the live page and ``GET /api/session`` for one session folder.

Two routes and nothing else: ``/`` (the page, a file of this package: its script and drawing are
inline, nothing is fetched from a CDN) and ``/api/session`` (:mod:`.live_state`). It binds
127.0.0.1 unless told otherwise; any other address needs a token, which every request must then
carry (``?token=`` or ``Authorization: Bearer``), compared in constant time. A request that fails
is answered and logged in one line; the server thread never raises into a sweep that runs it
(``--live``): the page watches, it never stops what it watches.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import UsageError
from .live_state import LiveSession

log = logging.getLogger("paretopipe.watch")
LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8765
MIN_TOKEN_CHARS = 16


def page() -> bytes:
    return resources.files(__package__).joinpath("live_page.html").read_bytes()


def check_binding(host: str, token: str | None) -> None:
    """Loopback needs nothing; any other address a token long enough not to be guessed."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise UsageError(f"--host {host!r}: give a numeric address (127.0.0.1, or 0.0.0.0 with --token)")
    if not loopback and not token:
        raise UsageError(f"--host {host}: the page would be reachable from other machines; give --token (at least "
                         f"{MIN_TOKEN_CHARS} characters, e.g. from: python -c 'import secrets; "
                         f"print(secrets.token_urlsafe())'), or keep the default {LOOPBACK}")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise UsageError(f"--token: {len(token)} characters; give at least {MIN_TOKEN_CHARS}")


class WatchServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, session: str | Path, host: str = LOOPBACK, port: int = DEFAULT_PORT,
                 token: str | None = None) -> None:
        check_binding(host, token)
        self.live, self.token = LiveSession(session), token
        self.lock = threading.Lock()  # one state read at a time: its record cache is shared
        self.page = page()
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is in use; give another with --port (or --live PORT), "
                                 f"or 0 for any free one")
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/" + (f"?token={self.token}" if self.token else "")

    def state_json(self) -> bytes:
        with self.lock:
            return json.dumps(self.live.state(), allow_nan=False).encode()

    def start_thread(self) -> threading.Thread:
        """Serve in a daemon thread (a sweep's ``--live``); the sweep stops it with :meth:`close`."""
        thread = threading.Thread(target=self.serve_forever, name="paretopipe-watch", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: WatchServer
    server_version = "paretopipe-watch"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            url = urlsplit(self.path)
            if not self._authorised(url.query):
                self._send(403, b"forbidden: this page needs its token (?token=...)\n", "text/plain")
                return
            if url.path == "/":
                self._send(200, self.server.page, "text/html; charset=utf-8")
            elif url.path == "/api/session":
                self._send(200, self.server.state_json(), "application/json")
            else:
                self._send(404, b"not found: / and /api/session only\n", "text/plain")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away
        except Exception as exc:  # noqa: BLE001 - a page error must never reach the sweep
            log.warning("watch: %s failed: %s", self.path[:80], str(exc).splitlines()[0][:200] if str(exc) else exc)
            try:
                self._send(500, f"error: {type(exc).__name__}\n".encode(), "text/plain")
            except OSError:
                pass

    def _authorised(self, query: str) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = (parse_qs(query).get("token") or [""])[0]
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer "):]
        ok = hmac.compare_digest(given.encode(), token.encode())
        if not ok:
            log.warning("watch: refused %s from %s: the token does not match", self.path.split("?")[0][:80],
                        self.client_address[0])
        return ok

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # The page's own script and style only: nothing from another origin may run in it.
        self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                                                    "style-src 'unsafe-inline'; img-src 'self' data:")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("watch: " + format, *args)
