"""Headless Chromium for tests, driven over the DevTools protocol on a pipe (no port opened)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: the
    browser reads commands on fd 3 and answers on fd 4, NUL-separated JSON); no port is opened."""

    def __init__(self, *flags: str) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes its answers
            high_r, high_w = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        # Its profile and the folders it makes beside it (org.chromium.Chromium.*) go in one folder
        # of its own, removed on close: 3.6 MB a browser was left under /tmp by every run otherwise.
        self.home = tempfile.mkdtemp(prefix="pp-browser-")
        self.proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--remote-debugging-pipe", *flags,
                                      "--user-data-dir=" + os.path.join(self.home, "profile"), "about:blank"],
                                     preexec_fn=fds, pass_fds=(3, 4),  # kept open after fds() set them
                                     start_new_session=True,  # its helpers too, ended as one group
                                     env={**os.environ, "TMPDIR": self.home},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None
        #: Every event the browser sent while a call waited (``Network.requestWillBeSent``, ...).
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if "method" in reply and "id" not in reply:
                    self.events.append(reply)
                elif reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buf += chunk
        raise TimeoutError(method)

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def eval(self, expression: str):
        return self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})["result"].get("value")

    def close(self) -> None:
        end_group(self.proc)
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.home, ignore_errors=True)


def end_group(proc: subprocess.Popen, wait_s: float = 10) -> None:
    """Kill a browser started in a session of its own and every helper it forked, and wait until
    none is left: a helper outliving the browser went on writing its cache into a profile folder
    already removed, and left it under /tmp."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def run_chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """One headless Chromium command (``--screenshot``, ``--dump-dom``), its profile and scratch
    folders in a folder of its own that is removed once it and its helpers have ended."""
    home = tempfile.mkdtemp(prefix="pp-browser-")
    proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             f"--user-data-dir={home}/profile", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": home},
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        end_group(proc)
        shutil.rmtree(home, ignore_errors=True)
