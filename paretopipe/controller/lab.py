"""A lab of N hosts on one machine: network namespaces on a bridge, each with an ``eth0``, an
address and its own sshd (key-only, a throwaway host key, authorized_keys in a temporary folder).

    root namespace: bridge <name>-br 10.77.S.1/24 (the controller reaches the hosts through it)
      host i: namespace <name>-h<i>, eth0 10.77.S.(10 + i)/24, sshd on port 22 of that address

A host may be aarch64 (``arch``): its stages then run the aarch64 Python of a debootstrap sysroot
under qemu-user, with this project installed there from a wheel (``make lab-arm`` builds both, in
``ARM_CACHE``), so that a Pi's architecture and install path take part in real sweeps.

``up`` writes a ``.env`` that points the sweeper at these hosts exactly as a user's ``.env`` points
at Pis (SSH_USER=root, the lab's key and known_hosts, IFACE=eth0, a fresh shared secret), and
``down`` removes everything ``up`` made, sshd stopped by its PID. Root only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..compute import cpushare
from ..errors import NetemError, UsageError
from ..sshcmd import close_shared
from .lab_processes import stop_marked, stop_zygote_daemons

_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
MAX_HOSTS = 8
#: The hosts' Ethernet MTU, and the largest packet their egress hands to its qdisc.
ETH_MTU = 1500
ARCHES = ("native", "aarch64")
SSHD = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def arm_python() -> Path:
    """The host-side wrapper that runs the sysroot's venv python under qemu (``make lab-arm``)."""
    return Path(os.environ.get("ARM_CACHE", "/var/cache/paretopipe-arm")) / "bin" / "python3-aarch64"


def check_arches(arches: list[str], hosts: int) -> list[str]:
    """One architecture per host (missing ones are native); an aarch64 host needs the sysroot."""
    if len(arches) > hosts:
        raise UsageError(f"--arch names {len(arches)} architectures for {hosts} hosts: give at most one per host")
    bad = [a for a in arches if a not in ARCHES]
    if bad:
        raise UsageError(f"--arch {bad[0]!r}: valid are {', '.join(ARCHES)} (one per host, comma-separated)")
    if "aarch64" in arches and not os.access(arm_python(), os.X_OK):
        raise UsageError(f"an aarch64 host needs the qemu sysroot with this project installed ({arm_python()} is "
                         f"missing): run `make lab-arm` first (about 14 minutes cold)")
    return list(arches) + ["native"] * (hosts - len(arches))


def state_dir(name: str) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"paretopipe-lab-{name}"


@dataclasses.dataclass
class Lab:
    name: str
    hosts: int
    subnet: int                      # the third octet of 10.77.S.0/24
    dir: Path
    sshd_pids: list[int] = dataclasses.field(default_factory=list)
    arches: list[str] = dataclasses.field(default_factory=list)
    broker_host: int | None = None  # the host whose namespace runs the lab's Mosquitto (--broker)
    broker_pid: int | None = None
    cpu: list[float | None] = dataclasses.field(default_factory=list)  # each host's CPU share (--host-cpu)
    cgroups: list[str] = dataclasses.field(default_factory=list)  # the groups that hold them

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    @property
    def gateway(self) -> str:
        return f"10.77.{self.subnet}.1"

    def namespace(self, i: int) -> str:
        return f"{self.name}-h{i}"

    def address(self, i: int) -> str:
        return f"10.77.{self.subnet}.{10 + i}"

    def veth(self, i: int) -> str:
        return f"{self.name}h{i}"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def env_file(self) -> Path:
        return self.dir / "lab.env"

    def addresses(self) -> list[str]:
        return [self.address(i) for i in range(1, self.hosts + 1)]

    def env_for(self, hosts: list[int], path: Path) -> Path:
        """The lab's .env with HOSTS naming ``hosts`` (1..N) in that order, written to ``path``: a
        sweep with it runs a plan of m stages on the first m of them (a placement of the devices)."""
        text = self.env_file.read_text()
        line = next(x for x in text.splitlines() if x.startswith("HOSTS="))
        path.write_text(text.replace(line, "HOSTS=" + ",".join(self.address(i) for i in hosts)))
        return path

    def save(self) -> None:
        (self.dir / "state.json").write_text(json.dumps({**dataclasses.asdict(self), "dir": str(self.dir)}, indent=1))

    @classmethod
    def load(cls, name: str) -> "Lab | None":
        path = state_dir(name) / "state.json"
        try:
            data = json.loads(path.read_text())
            return cls(name=data["name"], hosts=int(data["hosts"]), subnet=int(data["subnet"]), dir=Path(data["dir"]),
                       sshd_pids=[int(p) for p in data.get("sshd_pids", [])],
                       arches=[str(a) for a in data.get("arches", [])],
                       broker_host=data.get("broker_host"), broker_pid=data.get("broker_pid"),
                       cpu=list(data.get("cpu", [])), cgroups=[str(g) for g in data.get("cgroups", [])])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _run(*argv: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    out = subprocess.run(full, capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise NetemError(f"{' '.join(full)} failed: {' '.join(out.stderr.split()) or out.returncode}")
    return out


def require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("the lab needs root (network namespaces, a bridge, sshd): run it with sudo")
    missing = [tool for tool in ("ip", "tc", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if not any(Path(p).exists() for p in SSHD):
        missing.append("sshd")
    if missing:
        raise UsageError(f"the lab needs {', '.join(missing)}: apt-get install iproute2 openssh-server openssh-client")


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(f"lab name {name!r}: valid are 1-8 lowercase letters and digits, starting with a letter")
    return name


def up(name: str = "pplab", hosts: int = 2, subnet: int = 0, env_out: str | Path | None = None,
       remote_dir: str | None = None, remote_python: str | None = None, arches: list[str] | None = None,
       broker: int | None = None, cpu: list[float | None] | None = None) -> Lab:
    """Create the lab (after removing any earlier one of that name); returns it. ``broker``: the
    host (1..N) on whose address a Mosquitto broker runs for ``--transport mqtt`` (its MQTT_*
    lines go into the lab's .env). ``cpu``: each host's CPU share (None: unlimited), held by a
    cgroup around its sshd, so that every process started on that host over SSH (a stage, a
    profile) is as slow as a weaker device."""
    _check_name(name)
    if not 2 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts {hosts}: valid 2..{MAX_HOSTS} hosts in a lab")
    if not 0 <= subnet <= 255:
        raise UsageError(f"--subnet {subnet}: valid 0..255 (the third octet of 10.77.S.0/24)")
    per_host = check_arches(list(arches or []), hosts)
    if broker is not None and not 1 <= broker <= hosts:
        raise UsageError(f"--broker {broker}: name one of the lab's hosts, 1..{hosts}")
    require_root()
    down(name)
    shares = list(cpu) if cpu else [None] * hosts
    if len(shares) != hosts:
        raise UsageError(f"--host-cpu: give one share per host ({hosts}), e.g. 1,1,0.25")
    if any(s is not None for s in shares):
        cpushare.check_writable()
    lab = Lab(name, hosts, subnet, state_dir(name), arches=per_host, cpu=shares)
    lab.dir.mkdir(parents=True, mode=0o700)
    lab.save()  # so that down() can undo a half-made lab
    try:
        _network(lab)
        _sshd(lab)
        mqtt_env = _broker(lab, broker) if broker is not None else ""
    except BaseException:
        down(name)
        raise
    lab.save()
    _write_env(lab, env_out, remote_dir, remote_python, mqtt_env)
    return lab


def _broker(lab: Lab, i: int) -> str:
    """Mosquitto in host ``i``'s namespace on its address (port 1883), one user for the lab's
    stages confined to the lab's topics; its .env lines. It outlives ``up`` and ``down`` stops it."""
    # lazy for start-up: paho-mqtt (only a lab with a broker needs it)
    from ..transport.messaging.broker import Broker

    made = Broker(lab.address(i), 1883, users=("lab",), namespace=f"paretopipe/lab-{lab.name}",
                  folder=lab.dir / "mqtt", launcher=("ip", "netns", "exec", lab.namespace(i)), tied=False)
    lab.broker_host, lab.broker_pid = i, made.process.pid
    lab.save()
    made.log.close()
    return made.env_lines("lab")


def _network(lab: Lab) -> None:
    _run("ip", "link", "add", lab.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{lab.gateway}/24", "dev", lab.bridge)
    _run("ip", "link", "set", lab.bridge, "up")
    for i in range(1, lab.hosts + 1):
        ns, veth = lab.namespace(i), lab.veth(i)
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _run("ip", "link", "set", f"{veth}p", "netns", ns)
        _run("ip", "link", "set", f"{veth}p", "name", "eth0", ns=ns)
        _run("ip", "addr", "add", f"{lab.address(i)}/24", "dev", "eth0", ns=ns)
        # A host's egress leaves as wire-sized packets, as from a NIC without segmentation offload:
        # htb charges a 64 KB GSO packet only after it has let it through, so a 64 KB burst (a
        # language model's prefill, say) would cross a shaped link at line rate.
        _run("ip", "link", "set", "eth0", "gso_max_size", str(ETH_MTU), ns=ns)
        _run("ip", "link", "set", "lo", "up", ns=ns)
        _run("ip", "link", "set", "eth0", "up", ns=ns)
        _run("ip", "link", "set", veth, "master", lab.bridge)
        _run("ip", "link", "set", veth, "up")


def _sshd(lab: Lab) -> None:
    sshd = next(p for p in SSHD if Path(p).exists())
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(lab.key)], check=True)
    (lab.dir / "authorized_keys").write_text(lab.key.with_suffix(".pub").read_text())
    os.makedirs("/run/sshd", exist_ok=True)
    known = []
    for i in range(1, lab.hosts + 1):
        host_key = lab.dir / f"host{i}_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        known.append(f"{lab.address(i)} {' '.join(host_key.with_suffix('.pub').read_text().split()[:2])}")
        config = lab.dir / f"sshd{i}.conf"
        pid_file = lab.dir / f"sshd{i}.pid"
        config.write_text(f"""ListenAddress {lab.address(i)}
Port 22
HostKey {host_key}
AuthorizedKeysFile {lab.dir / 'authorized_keys'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {pid_file}
""")
        _run(sshd, "-f", str(config), ns=lab.namespace(i))
        deadline = time.monotonic() + 10
        while not _read_pid(pid_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = _read_pid(pid_file)
        if not pid:
            raise NetemError(f"sshd in {lab.namespace(i)} did not start")
        lab.sshd_pids.append(pid)
        if lab.cpu and lab.cpu[i - 1] is not None:
            lab.cgroups.append(cpushare.limit(pid, lab.cpu[i - 1], f"lab-{lab.name}-h{i}")["cgroup"])
        lab.save()
    lab.known_hosts.write_text("\n".join(known) + "\n")
    for i in range(1, lab.hosts + 1):  # every sshd answers before up() returns
        _wait_ssh(lab, i)


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()  # sshd may have created it and not yet written it
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _wait_ssh(lab: Lab, i: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}",
                              "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=3", "-i", str(lab.key),
                              "--", f"root@{lab.address(i)}", "true"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise NetemError(f"cannot ssh to lab host {lab.address(i)}: {out.stderr.strip()[-200:]}")
        time.sleep(0.2)


def _write_env(lab: Lab, env_out: str | Path | None, remote_dir: str | None, remote_python: str | None,
               mqtt_env: str = "") -> None:
    # the hosts share this machine's files, so a relative folder means one here, not under root's home
    root = Path(__file__).resolve().parents[2] if remote_dir is None else Path(remote_dir).resolve()
    native = remote_python or sys.executable
    pythons = [str(arm_python()) if arch == "aarch64" else native for arch in lab.arches]
    # an aarch64 host runs the wheel installed in its sysroot's venv; REMOTE_DIR is only its cd
    per_host = f"REMOTE_PYTHONS={','.join(pythons)}\n" if "aarch64" in lab.arches else ""
    text = f"""# Written by `paretopipe lab up` for the lab {lab.name!r}: {lab.hosts} namespace hosts with their own sshd.
# Point the sweeper at it with --env-file {lab.env_file}; `paretopipe lab down` removes it all.
HOSTS={','.join(lab.addresses())}
SSH_USER=root
SSH_KEY={lab.key}
SSH_KNOWN_HOSTS={lab.known_hosts}
SSH_PORT=22
REMOTE_DIR={root}
REMOTE_PYTHON={native}
{per_host}PORT=5555
MASTER_PORT=29500
IFACE=eth0
PARETOPIPE_SECRET={secrets.token_hex(16)}
{mqtt_env}"""
    lab.env_file.write_text(text)
    if env_out is not None:
        out = Path(env_out)
        if out.exists() and "Written by `paretopipe lab up`" not in out.read_text(errors="replace"):
            raise UsageError(f"{out} exists and was not written by the lab: not overwriting it (give --env another path)")
        out.write_text(text)


def down(name: str = "pplab") -> list[str]:
    """Remove what ``up`` made: sshd (by PID), namespaces (with their qdiscs), veths, bridge, files."""
    _check_name(name)
    removed = []
    lab = Lab.load(name)
    for i in range(1, lab.hosts + 1) if lab else ():  # before its sshd: no shared connection outlives the lab
        if close_shared(f"root@{lab.address(i)}", str(lab.key), None, str(lab.known_hosts)):
            removed.append(f"shared ssh connection to {lab.address(i)}")
    # The recorded PIDs, and any sshd still started with one of this lab's configs (a half-made lab's
    # last one): never someone else's process.
    for program, marker, known in ((b"sshd", f"{state_dir(name)}/sshd".encode(), lab.sshd_pids if lab else []),
                                   (b"mosquitto", f"{state_dir(name)}/mqtt/".encode(),
                                    [lab.broker_pid] if lab and lab.broker_pid else [])):
        removed += stop_marked(program, marker, known)
    for group in lab.cgroups if lab else []:  # a host's CPU share: what is left in it goes back to the root
        cpushare.remove_group(group)
        removed.append(f"cgroup {Path(group).name}")
    ours = [line.split(" ")[0] for line in _run("ip", "netns", "list", check=False).stdout.split("\n")
            if re.fullmatch(rf"{re.escape(name)}-h\d+", line.split(" ")[0])]
    removed += stop_zygote_daemons(ours)  # started by the stages' sessions: nothing else ends them now
    for ns in ours:
        _run("ip", "netns", "del", ns, check=False)
        removed.append(f"namespace {ns}")
    links = _run("ip", "-o", "link", "show", check=False).stdout.split("\n")
    for line in links:
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link == f"{name}-br" or re.fullmatch(rf"{re.escape(name)}h\d+", link):
                _run("ip", "link", "del", link, check=False)
                removed.append(f"link {link}")
    if lab is not None or state_dir(name).exists():
        shutil.rmtree(state_dir(name), ignore_errors=True)
    return removed


def status(name: str = "pplab") -> dict[str, Any]:
    _check_name(name)
    lab = Lab.load(name)
    namespaces = [line.split(" ")[0] for line in _run("ip", "netns", "list", check=False).stdout.split("\n")
                  if line.startswith(f"{name}-h")]
    return {"name": name, "up": lab is not None and bool(namespaces), "namespaces": namespaces,
            "hosts": lab.addresses() if lab else [], "arches": lab.arches if lab else [],
            "broker": f"{lab.address(lab.broker_host)}:1883" if lab and lab.broker_host else None,
            "env_file": str(lab.env_file) if lab else None,
            "sshd_pids": [p for p in (lab.sshd_pids if lab else []) if Path(f"/proc/{p}").exists()]}
