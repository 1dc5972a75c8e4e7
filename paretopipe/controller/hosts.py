"""Where stages run: this machine, or hosts reached over SSH with keys (a Pi, a GPU server, a lab
namespace), and the processes started there.

Hosts come from ``.env`` (``HOSTS=a,b,c``, or the anchor's ``PI1_IP`` and ``PI2_IP``/``GPU_IP``),
or from an experiment file. Every value that reaches a remote shell line is quoted, and user and
host names are checked before they reach ssh, which gets ``--`` before the destination.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from typing import Any, Sequence

from ..errors import PeerError, UsageError
from ..network import tc
from ..transport.auth import load_secret
from ..sshcmd import check_host, check_user, remote_path, ssh_argv
from . import zygote
from .zygote_daemon import ATTACH
from ..energy.memory import parse_size
from .. import strict

DEVICES_HELP = "cpu, cuda or cuda:N"


def _per_host(env: dict[str, str], key: str) -> list[str]:
    """A comma-separated .env value with one entry per host, in the order of HOSTS; an empty entry
    keeps its place (that host takes the shared value)."""
    value = env.get(key, "").strip()
    return [v.strip() for v in value.split(",")] if value else []


def check_device_name(device: str, what: str = "device") -> str:
    if device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        return device
    raise UsageError(f"{what} {device!r}: valid {DEVICES_HELP}")


def _port(value: str | int | None, what: str, default: int | None) -> int | None:
    if value in (None, ""):
        return default
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what}={value!r} is not a TCP port (1..65535)")
    if not 0 < port < 65536:
        raise UsageError(f"{what}={value!r} is not a TCP port (1..65535)")
    return port


def _watts(values: list[str], i: int, key: str) -> float | None:
    if i >= len(values) or not values[i]:
        return None
    try:
        watts = float(values[i])
    except ValueError:
        raise UsageError(f"{key} entry {values[i]!r} is not a number of watts (one per host, e.g. 2.7,45)")
    if not watts >= 0 or watts == float("inf"):
        raise UsageError(f"{key} entry {values[i]!r}: give watts, 0 or more")
    return watts


def _limit(values: list[str], i: int) -> int | None:
    return parse_size(values[i], "MEMORY_LIMITS entry") if i < len(values) and values[i] else None


def _path(value: str | None) -> str | None:
    """A local file named in .env: ``~`` expanded here (ssh gets it as an argument, not via a shell)."""
    return os.path.expanduser(value) if value else None


@dataclasses.dataclass
class Host:
    """One machine reached over SSH, and how to run this package there."""

    address: str
    user: str | None = None
    key: str | None = None
    ssh_port: int | None = None
    known_hosts: str | None = None
    remote_dir: str = "~/paretopipe"
    remote_python: str = "python3"
    device: str = "cpu"
    iface: str | None = None
    # Its declared powers (the modelled energy where it has no sensor: idle watts, and the watts one
    # busy core adds) and its memory limit in bytes: POWER_IDLE_W, POWER_CORE_W, MEMORY_LIMITS.
    power_idle_w: float | None = None
    power_core_w: float | None = None
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        check_host(self.address)
        for name in ("power_idle_w", "power_core_w", "memory_limit"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise UsageError(f"{name} of {self.address}: {getattr(self, name)} must be 0 or more")
        if self.user is not None:
            check_user(self.user)
        check_device_name(self.device, f"device of {self.address}")

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address

    def ssh(self) -> list[str]:
        return ssh_argv(self.target, self.key, self.ssh_port, self.known_hosts)

    def runner(self) -> tc.Runner:
        """Runs commands there (tc, ip) with ``sudo -n`` unless we log in as root."""
        return tc.Runner(self.target, self.key, sudo=self.user not in (None, "root"), ssh_port=self.ssh_port,
                         known_hosts=self.known_hosts)

    def shell_line(self, module: str, args: Sequence[str], env: dict[str, str] | None = None,
                   fork: bool = False) -> str:
        """``cd REMOTE_DIR && exec [env K=V] REMOTE_PYTHON -m module args``, every value quoted;
        ``fork``: the module is forked from the host's zygote daemon (``-m zygote_daemon module args``)."""
        prefix = ""
        if env:
            prefix = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " "
        modules = [ATTACH, module] if fork else [module]
        return (f"cd {remote_path(self.remote_dir)} && exec {prefix}{shlex.quote(self.remote_python)} -m "
                f"{shlex.join(modules + list(args))}")

    def argv(self, module: str, args: Sequence[str], env: dict[str, str] | None = None,
             fork: bool = False) -> list[str]:
        return self.ssh() + [self.shell_line(module, args, env, fork)]


@dataclasses.dataclass
class Testbed:
    """The hosts of an experiment (none: every stage runs on this machine) and their shared settings."""

    hosts: list[Host] = dataclasses.field(default_factory=list)
    data_port: int = 5555
    rpc_port: int = 29500
    iface: str | None = None
    secret: str | None = None
    # .env's MQTT_* keys (a broker the testbed's stages reach): like the secret, never written to a file.
    mqtt_env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def remote(self) -> bool:
        return len(self.hosts) >= 2

    def stage_hosts(self, stages: int) -> list[Host]:
        if len(self.hosts) < stages:
            raise UsageError(f"{stages} stages need {stages} hosts; .env names {len(self.hosts)} "
                             f"({', '.join(h.address for h in self.hosts) or 'none'}): add them to HOSTS")
        return self.hosts[:stages]

    def label(self) -> str:
        """The testbed's name in a shared study: ``local``, or its hosts' addresses joined by ``+``."""
        return "+".join(h.address for h in self.hosts) if self.remote else "local"

    def describe(self) -> dict[str, Any]:
        """For session.json: everything but the key path and the secret."""
        return {"hosts": [{k: v for k, v in dataclasses.asdict(h).items() if k != "key"} for h in self.hosts],
                "data_port": self.data_port, "rpc_port": self.rpc_port, "iface": self.iface,
                "authenticated": self.secret is not None}

    def to_table(self) -> dict[str, Any]:
        """The ``[hosts]`` table of an experiment file (never the secret; the key is only a path)."""
        hosts = [{k: v for k, v in dataclasses.asdict(h).items() if v is not None} for h in self.hosts]
        out: dict[str, Any] = {"list": hosts, "data_port": self.data_port, "rpc_port": self.rpc_port}
        if self.iface:
            out["iface"] = self.iface
        return out

    @classmethod
    def from_table(cls, table: dict[str, Any], env: dict[str, str], devices: Sequence[str] | None = None) -> "Testbed":
        """An experiment file's ``[hosts]`` with an inline ``list`` of hosts; the secret still comes
        from ``.env`` or the environment, never from the file."""
        allowed = {"list", "data_port", "rpc_port", "iface", "env_file"}
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise UsageError(f"experiment [hosts]: unknown key {unknown[0]!r}; valid: {', '.join(sorted(allowed))} "
                             f"(the secret stays in .env as PARETOPIPE_SECRET)")
        items = table.get("list") or []
        if not isinstance(items, list):
            raise UsageError("experiment [hosts] list: give a list of tables, e.g. list = [{address = \"10.0.0.2\"}]")
        hosts = [strict.from_dict(Host, item, f"experiment host {i + 1}") for i, item in enumerate(items)]
        for i, h in enumerate(hosts):
            h.key, h.known_hosts = _path(h.key), _path(h.known_hosts)
            if devices and i < len(devices) and devices[i]:
                h.device = devices[i]
            h.iface = h.iface or table.get("iface")
        if len(hosts) == 1:
            raise UsageError(f"experiment [hosts] names one host ({hosts[0].address}); a testbed needs at least two")
        secret = env.get("PARETOPIPE_SECRET") or None
        load_secret(secret or "")
        return cls(hosts=hosts, data_port=_port(table.get("data_port"), "data_port", 5555),
                   rpc_port=_port(table.get("rpc_port"), "rpc_port", 29500), iface=table.get("iface"), secret=secret,
                   mqtt_env=_mqtt_env(env))

    @classmethod
    def from_env(cls, env: dict[str, str], devices: Sequence[str] | None = None) -> "Testbed":
        """``HOSTS=a,b,c`` (or ``PI1_IP`` + ``PI2_IP``/``GPU_IP``), ``SSH_*``, ``REMOTE_*`` (``REMOTE_DIRS``
        and ``REMOTE_PYTHONS`` give one folder and one python per host), ``PORT``,
        ``MASTER_PORT``, ``IFACE``, devices from ``DEVICES=cpu,cuda`` or ``PI1_DEVICE``/``PI2_DEVICE``/
        ``GPU_DEVICE`` (``devices`` overrides), and ``PARETOPIPE_SECRET``."""
        names: list[tuple[str, str | None]] = []
        if env.get("HOSTS"):
            names = [(h.strip(), None) for h in env["HOSTS"].split(",") if h.strip()]
        elif env.get("PI1_IP"):
            names = [(env["PI1_IP"], env.get("PI1_DEVICE"))]
            if env.get("PI2_IP"):
                names.append((env["PI2_IP"], env.get("PI2_DEVICE")))
            elif env.get("GPU_IP"):
                names.append((env["GPU_IP"], env.get("GPU_DEVICE") or "cuda"))
        listed, dirs, pythons = (_per_host(env, key) for key in ("DEVICES", "REMOTE_DIRS", "REMOTE_PYTHONS"))
        idle, core, limits = (_per_host(env, key) for key in ("POWER_IDLE_W", "POWER_CORE_W", "MEMORY_LIMITS"))
        ssh_port = _port(env.get("SSH_PORT"), "SSH_PORT", None)
        hosts = []
        for i, (name, device) in enumerate(names):
            user, _, address = name.rpartition("@")
            pick = (list(devices)[i] if devices and i < len(devices) else None) or \
                (listed[i] if i < len(listed) else None) or device or "cpu"
            hosts.append(Host(address=address, user=user or env.get("SSH_USER") or None, key=_path(env.get("SSH_KEY")),
                              ssh_port=ssh_port, known_hosts=_path(env.get("SSH_KNOWN_HOSTS")),
                              remote_dir=(dirs[i] if i < len(dirs) else None) or env.get("REMOTE_DIR") or "~/paretopipe",
                              remote_python=(pythons[i] if i < len(pythons) else None) or env.get("REMOTE_PYTHON")
                              or "python3", device=pick,
                              iface=env.get("IFACE") or None,
                              power_idle_w=_watts(idle, i, "POWER_IDLE_W"), power_core_w=_watts(core, i, "POWER_CORE_W"),
                              memory_limit=_limit(limits, i)))
        if len(hosts) == 1:
            raise UsageError(f".env names one host ({hosts[0].address}); a testbed needs at least two "
                             f"(HOSTS=a,b or PI1_IP and PI2_IP/GPU_IP), or none to run locally")
        secret = env.get("PARETOPIPE_SECRET") or None
        load_secret(secret or "")  # a secret too short to be one is refused now, not at the first run
        return cls(hosts=hosts, data_port=_port(env.get("PORT"), "PORT", 5555),
                   rpc_port=_port(env.get("MASTER_PORT"), "MASTER_PORT", 29500), iface=env.get("IFACE") or None,
                   secret=secret, mqtt_env=_mqtt_env(env))


def stop_all(procs: Sequence["StageProcess"], polite_s: float = 5.0) -> None:
    """Stop processes together: every one is asked to quit first, so their exits overlap."""
    for proc in procs:
        proc.ask_to_quit()
    deadline = time.monotonic() + polite_s
    for proc in procs:
        proc.stop(max(0.0, deadline - time.monotonic()))


class StageProcess:
    """One process of the sweep (a TCP stage worker or an RPC rank), here or over SSH, that speaks
    JSON lines on stdin/stdout; stopped by the PID it reported, never by name."""

    def __init__(self, role: str, argv: list[str], ssh: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.role, self.ssh = role, ssh
        self.lines: queue.Queue = queue.Queue()
        # here: forked from the zygote, which has torch imported already; over SSH: a plain start
        self.proc = zygote.launch(argv, env, fork=ssh is None)
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.pid: int | None = None
        self.info: dict[str, Any] = {}

    def _pump(self, stream, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout:
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        raise ValueError
                    self.lines.put(msg)
                except ValueError:
                    self.stderr_tail = (self.stderr_tail + [line])[-20:]
            else:
                self.stderr_tail = (self.stderr_tail + [line])[-20:]
        self.lines.put(None)

    def expect(self, *events: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PeerError(f"{self.role} gave no {'/'.join(events)} within {timeout:g}s")
            try:
                msg = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                self.lines.put(None)  # later calls see the end too
                tail = "".join(self.stderr_tail[-3:]).strip().replace("\n", " | ")
                raise PeerError(f"{self.role} exited (code {self.proc.poll()})" + (f": {tail[-400:]}" if tail else ""))
            if msg.get("event") == "error":
                raise PeerError(f"{self.role}: {str(msg.get('error'))[:500]}")
            if msg.get("event") in events:
                return msg

    def ready(self, timeout: float) -> dict[str, Any]:
        self.info = self.expect("ready", timeout=timeout)
        if not isinstance(self.info.get("pid"), int) or self.info["pid"] <= 1:
            raise PeerError(f"{self.role} reported no usable pid")
        self.pid = self.info["pid"]
        return self.info

    def send(self, obj: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise PeerError(f"{self.role} is gone")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, name: str) -> None:
        """Send SIGKILL, SIGSTOP or SIGCONT (``name`` KILL, STOP, CONT) to the PID it reported,
        over SSH for a remote one (a fault, :mod:`.faultinject`)."""
        if name not in ("KILL", "STOP", "CONT") or not isinstance(self.pid, int):
            raise PeerError(f"{self.role}: cannot send {name!r} (valid KILL, STOP, CONT, to a reported pid)")
        if self.ssh is None:
            try:
                os.kill(self.pid, getattr(signal, f"SIG{name}"))
            except ProcessLookupError:
                raise PeerError(f"{self.role} (pid {self.pid}) is gone")
            return
        try:
            done = subprocess.run(self.ssh + [f"kill -{name} {int(self.pid)}"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerError(f"{self.role}: kill -{name} over SSH failed: {exc}")
        if done.returncode != 0:
            raise PeerError(f"{self.role}: kill -{name} {self.pid} failed: {done.stderr.strip()[-200:]}")

    def ask_to_quit(self) -> None:
        if self.alive():
            try:
                self.send({"cmd": "quit"})
            except PeerError:
                pass

    def stop(self, polite_s: float = 5.0) -> None:
        """Ask politely, then signal the PID it reported (remote: over SSH, only if it is still
        there), then kill."""
        self.ask_to_quit()
        try:
            self.proc.wait(polite_s)
        except subprocess.TimeoutExpired:
            pass
        if self.ssh and isinstance(self.pid, int):
            pid = int(self.pid)
            # Only a process that outlived its quit waits the second before SIGKILL.
            line = (f"kill -0 {pid} 2>/dev/null || exit 0; kill -TERM {pid} 2>/dev/null; sleep 1; "
                    f"kill -KILL {pid} 2>/dev/null; true")
            try:
                subprocess.run(self.ssh + [line], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
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


def _mqtt_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("MQTT_") and v}
