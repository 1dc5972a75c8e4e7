"""A Mosquitto broker the project starts for a run (Debian's ``mosquitto``, which ``make``
installs): in a folder of its own, on one address and port, anonymous clients refused, a
password file with one user per stage and an ACL that lets each of them use its run's namespace
only (and read the broker's version). Stopped and its folder removed when done.

    paretopipe broker [--host 127.0.0.1] [--port 1883] [--stages 2]

runs one in the foreground and prints the ``.env`` lines of each stage's user."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from ...errors import ParetoPipeError, UsageError
from .mqtt import MqttSettings, MqttClient, check_namespace, check_qos

MOSQUITTO_PATHS = ("/usr/sbin/mosquitto", "/usr/bin/mosquitto")


def _with_parent() -> list[str]:
    """The prefix that makes the kernel stop the broker when the process that started it exits (a
    killed sweep or test), set by util-linux's setpriv before it executes the broker: a
    ``preexec_fn`` would run Python in a child forked from a process with threads."""
    found = shutil.which("setpriv")
    return [found, "--pdeathsig", "TERM"] if found else []


def mosquitto_binary() -> str | None:
    found = shutil.which("mosquitto")
    return found or next((p for p in MOSQUITTO_PATHS if Path(p).is_file()), None)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Broker:
    """A running Mosquitto with ``users``, each allowed the run's ``namespace``/# only, and
    ``others`` (user -> namespace): the users of other runs on the same broker, each confined to
    its own namespace. Passwords are drawn here, one per user."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, users: Sequence[str] = ("stage1", "stage2"),
                 namespace: str | None = None, startup_timeout: float = 10.0,
                 others: Mapping[str, str] | None = None, folder: Path | None = None,
                 launcher: Sequence[str] = (), tied: bool = True) -> None:
        """``folder``: where its files go (a fresh temporary one if None); ``launcher``: a prefix
        of its command (``ip netns exec NS`` puts it on a lab host); ``tied``: it stops when this
        process dies (False: it outlives it, as a lab's broker does, and whoever owns the folder
        stops it by its PID)."""
        binary = mosquitto_binary()
        if binary is None:
            raise UsageError("--transport mqtt: no Mosquitto broker here (apt-get install mosquitto, or make, "
                             "installs it; or set MQTT_BROKER to one you run)")
        self.host, self.port = host, port or _free_port(host)
        self.namespace = check_namespace(namespace or f"paretopipe/{secrets.token_hex(6)}")
        if folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="paretopipe-mosquitto-"))
        else:
            self.folder = Path(folder)
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.namespaces = {**{u: self.namespace for u in users},
                           **{u: check_namespace(ns) for u, ns in (others or {}).items()}}
        self.passwords = {u: secrets.token_urlsafe(18) for u in self.namespaces}
        self._write_files()
        self._launch([*launcher, *(_with_parent() if tied else []), binary, "-c", str(self.folder / "mosquitto.conf")],
                     tied, startup_timeout, port_drawn=not port)

    def _launch(self, argv: list[str], tied: bool, startup_timeout: float, port_drawn: bool) -> None:
        """Start Mosquitto and wait until its own users get in. A port drawn here can be taken by
        another program between the draw and Mosquitto's bind (it then exits with "Address already
        in use"): such a port is drawn again, up to three times; a port the caller gave is not."""
        for attempt in (1, 2, 3):
            self.log = open(self.folder / "mosquitto.log", "wb")
            self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=not tied)
            deadline = time.monotonic() + startup_timeout
            while not self._running():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            else:
                return
            tail = self.log_tail()
            if port_drawn and attempt < 3 and self.process.poll() is not None and "Address already in use" in tail:
                self.log.close()
                self.port = _free_port(self.host)
                self._write_conf()
                continue
            self.stop()
            raise ParetoPipeError(f"Mosquitto did not start on {self.host}:{self.port}: {tail}")

    def _write_files(self) -> None:
        passwd = self.folder / "passwd"
        passwd.touch(mode=0o600)
        for user, password in self.passwords.items():
            # mosquitto_passwd hashes the password (PBKDF2); it is given on the command line of a
            # local child only, never a remote shell.
            subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True,
                           capture_output=True, timeout=30)
        acl = "".join(f"user {u}\ntopic readwrite {ns}/#\ntopic read $SYS/broker/version\n\n"
                      for u, ns in self.namespaces.items())
        (self.folder / "acl").write_text(acl)
        self._write_conf()

    def _write_conf(self) -> None:
        passwd = self.folder / "passwd"
        (self.folder / "mosquitto.conf").write_text(
            # As root, Mosquitto would switch to the user "mosquitto", who cannot read this private folder.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}\n"
            f"listener {self.port} {self.host}\nallow_anonymous false\npassword_file {passwd}\n"
            f"acl_file {self.folder / 'acl'}\npersistence false\nsys_interval 10\n"
            f"max_queued_messages 0\nmax_inflight_messages 0\nset_tcp_nodelay true\nlog_dest stderr\nlog_type error\nlog_type warning\n")

    def _running(self) -> bool:
        """A client of this broker's own users gets in (a port that merely answers could be another
        program's; Mosquitto exits when the port is taken)."""
        if self.process.poll() is not None:
            return False
        try:
            MqttClient(self.settings(next(iter(self.passwords))), "paretopipe-probe", lambda *_: None, 0.3).close()
        except ParetoPipeError:
            return False
        return True

    def settings(self, user: str, qos: int = 0) -> MqttSettings:
        """What stage ``user`` connects with."""
        return MqttSettings(self.host, self.port, user, self.passwords[user], self.namespaces[user], check_qos(qos))

    def env_lines(self, user: str) -> str:
        return (f"MQTT_BROKER={self.host}:{self.port}\nMQTT_USERNAME={user}\nMQTT_PASSWORD={self.passwords[user]}\n"
                f"MQTT_NAMESPACE={self.namespaces[user]}\n")

    def log_tail(self, chars: int = 300) -> str:
        try:
            return (self.folder / "mosquitto.log").read_text(errors="replace").strip()[-chars:] or "no log"
        except OSError:
            return "no log"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
