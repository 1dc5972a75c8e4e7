"""Where stages run: this machine or hosts from ``.env`` over SSH, and the stage processes there."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any

from ..errors import PeerError, UsageError
from ..network import tc
from ..sshcmd import ssh_argv


@dataclasses.dataclass
class Hosts:
    """Where the stages run: local processes, or two hosts over SSH (from .env)."""

    stage1: str | None = None
    stage2: str | None = None
    user: str | None = None
    key: str | None = None
    remote_dir: str = "~/paretopipe"
    remote_python: str = "python3"
    port: int = 5555
    iface: str | None = None
    ssh_port: int | None = None
    known_hosts: str | None = None

    @property
    def remote(self) -> bool:
        return bool(self.stage1 and self.stage2)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Hosts":
        port = env.get("PORT", "5555")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"PORT={port!r} in .env is not a TCP port (1..65535)")
        return cls(stage1=env.get("PI1_IP") or None, stage2=env.get("PI2_IP") or env.get("GPU_IP") or None,
                   user=env.get("SSH_USER") or None, key=env.get("SSH_KEY") or None,
                   remote_dir=env.get("REMOTE_DIR") or "~/paretopipe",
                   remote_python=env.get("REMOTE_PYTHON") or "python3", port=int(port),
                   iface=env.get("IFACE") or None,
                   ssh_port=int(env["SSH_PORT"]) if env.get("SSH_PORT") else None,
                   known_hosts=env.get("SSH_KNOWN_HOSTS") or None)

    def ssh(self, host: str) -> list[str]:
        return ssh_argv(self.target(host), self.key, self.ssh_port, self.known_hosts)

    def runner(self, host: str | None) -> tc.Runner:
        if host is None:
            return tc.Runner()
        return tc.Runner(self.target(host), self.key, sudo=self.user not in (None, "root"),
                            ssh_port=self.ssh_port, known_hosts=self.known_hosts)

    def target(self, host: str) -> str:
        return f"{self.user}@{host}" if self.user else host


class StageProcess:
    """One stage worker process (``paretopipe.runners.worker``), here or over SSH; stopped by the PID
    it reported, never by name."""

    def __init__(self, role: str, argv: list[str], ssh: list[str] | None = None) -> None:
        self.role, self.ssh = role, ssh
        self.lines: queue.Queue = queue.Queue()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, start_new_session=True)
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.pid: int | None = None
        self.info: dict[str, Any] = {}

    def _pump(self, stream, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout:
                try:
                    self.lines.put(json.loads(line))
                except json.JSONDecodeError:
                    self.stderr_tail = (self.stderr_tail + [line])[-20:]
            else:
                self.stderr_tail = (self.stderr_tail + [line])[-20:]
        self.lines.put(None)

    def expect(self, *events: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerError(f"{self.role} worker gave no {'/'.join(events)} within {timeout:g}s")
            try:
                msg = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                tail = "".join(self.stderr_tail[-3:]).strip().replace("\n", " | ")
                raise PeerError(f"{self.role} worker exited (code {self.proc.poll()})" + (f": {tail}" if tail else ""))
            if msg.get("event") == "error":
                raise PeerError(f"{self.role}: {msg.get('error')}")
            if msg.get("event") in events:
                return msg

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise PeerError(f"{self.role} worker is gone")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ask politely, then signal the PID it reported (remote: over SSH), then kill."""
        if self.alive():
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(5)
            except (PeerError, subprocess.TimeoutExpired):
                pass
        if self.ssh and self.pid:
            subprocess.run(self.ssh + [f"kill -TERM {self.pid} 2>/dev/null; sleep 1; kill -KILL {self.pid} 2>/dev/null; true"],
                           capture_output=True, timeout=30)
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
