"""The power sensors of this host, each detected at start and read by the sampler.

A sensor reads a dict of channels: an ``energy`` sensor a cumulative counter in joules (RAPL,
NVML's total-energy counter), a ``power`` sensor watts now (INA2xx/INA3221 through hwmon, a
Raspberry Pi 5's PMIC, NVML's power reading). Its ``total`` channel is its share of the device's
power; the others are parts of it (a CPU rail, DRAM) or overlap it (RAPL's psys), kept for the
record. Readers take a root folder so that tests can point them at fixture trees.

Why not zeus (``zeus`` on PyPI), which was looked at first: its RAPL reader is fixed to
``/sys/class/powercap/intel-rapl`` and starts a polling process per counter for wraparound, it has
no reader for a Pi 5's PMIC or an INA219/INA226 board, and it brings scikit-learn, amdsmi,
pydantic, tyro and httpx onto a Pi for what, on a GPU, is three NVML calls this module makes
through nvidia-ml-py (which the suite already uses). The readers here are a file read each.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Protocol

log = logging.getLogger("paretopipe.energy")

#: Drivers of the TI current/power monitors a Pi 4 board or a Jetson exposes through hwmon.
INA_DRIVERS = {"ina209", "ina219", "ina220", "ina226", "ina230", "ina231", "ina238", "ina260", "ina2xx", "ina3221"}
#: A channel with this label measures the board's input, so it is the device total by itself
#: (a Jetson's INA3221: VDD_IN, or POM_5V_IN on older modules; the other rails are inside it).
_INPUT_RAIL = re.compile(r"(^|_)(VDD_IN|5V_IN|IN)$", re.IGNORECASE)
#: A Pi 5's PMIC rails that belong to DRAM (LPDDR4X core and I/O supplies).
PI_DRAM_RAILS = ("DDR_VDD2", "DDR_VDDQ")
PI_CPU_RAIL = "VDD_CORE"
RAPL_UDEV_FIX = ('ACTION=="add", SUBSYSTEM=="powercap", RUN+="/bin/chmod a+r /sys%p/energy_uj" '
                 "in /etc/udev/rules.d/99-powercap.rules (then reboot, or chmod a+r the files once)")


class Sensor(Protocol):
    name: str
    path: str
    kind: str  # "energy": cumulative joules; "power": watts now

    def read(self) -> dict[str, float]: ...


def describe(sensor: Sensor) -> dict[str, Any]:
    """What the manifest records of a sensor: its name, where it is read, and what it reads."""
    return {"name": sensor.name, "path": sensor.path, "kind": sensor.kind,
            "unit": "J (cumulative)" if sensor.kind == "energy" else "W"}


def _text(path: Path) -> str:
    return path.read_text().strip()


class _Value:
    """An integer sysfs attribute read again and again through one open descriptor (``pread`` at
    offset 0 makes the kernel fill it afresh): about 3 us a read, against 30 us to open the file
    each time, which a 100 Hz sampler would pay on every sensor of every sample."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def read(self) -> int:
        return int(os.pread(self.fd, 64, 0))

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


# -- Linux powercap RAPL (Intel, and AMD since Linux 5.8) ----------------------------------------
class Rapl:
    """Every RAPL zone of the host: packages and DRAM add up to the total (cores and uncore are
    inside a package, psys overlaps everything: both are kept as parts), each counter unwrapped
    with its ``max_energy_range_uj``."""

    kind = "energy"

    def __init__(self, zones: list[Path]) -> None:
        self.name, self.path = "rapl", str(zones[0].parent)
        self.zones = [(z, _text(z / "name"), int(_text(z / "max_energy_range_uj")), _Value(z / "energy_uj"))
                      for z in zones]
        names = [n for _, n, _, _ in self.zones]
        summed = [n for n in names if n.startswith("package") or n == "dram"]
        self.totalled = set(summed) or ({"psys"} if "psys" in names else set())
        self._last: dict[Path, int] = {}
        self._wraps: dict[Path, int] = {}

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {"total": 0.0}
        for zone, name, max_uj, counter in self.zones:
            raw = counter.read()
            last = self._last.get(zone)
            if last is not None and raw < last:  # wrapped past max_energy_range_uj
                self._wraps[zone] = self._wraps.get(zone, 0) + 1
            self._last[zone] = raw
            joules = (raw + self._wraps.get(zone, 0) * max_uj) / 1e6
            key = name if name not in out else f"{name}:{zone.name}"
            out[key] = joules
            if name in self.totalled:
                out["total"] += joules
        return out


def detect_rapl(root: Path, notes: list[str]) -> list[Sensor]:
    base = root / "sys/class/powercap"
    zones = sorted(p for p in base.glob("*rapl*") if (p / "energy_uj").exists() and (p / "name").is_file())
    if not zones:
        return []
    try:
        rapl = Rapl(zones)
        rapl.read()
        return [rapl]
    except PermissionError as exc:
        notes.append(f"RAPL {exc.filename or base} is readable by root only (Linux 5.10 and later): the energy of "
                     f"this host is not measured; allow it with a udev rule: {RAPL_UDEV_FIX}")
    except (OSError, ValueError) as exc:
        notes.append(f"RAPL under {base} is not usable ({exc}); no energy from it")
    return []


# -- INA2xx / INA3221 through hwmon (a Pi 4 with a power board, a Jetson) -----------------------
class HwmonMonitor:
    """One hwmon device of a TI power monitor: each channel's watts (``power*_input`` in
    microwatts, or bus ``in*_input`` millivolts times ``curr*_input`` milliamps), labelled by its
    ``*_label``; the total is the input rail where one is labelled so, else the channels' sum."""

    kind = "power"

    def __init__(self, device: Path, chip: str) -> None:
        self.name, self.path = f"hwmon:{chip}", str(device)
        self.channels: list[tuple[str, Callable[[], float]]] = []
        indices = sorted({int(m.group(1)) for f in device.iterdir()
                          if (m := re.match(r"(?:power|curr)(\d+)_input$", f.name))})
        for i in indices:
            label = _label(device, i) or f"channel{i}"
            power = device / f"power{i}_input"
            volt, curr = device / f"in{i}_input", device / f"curr{i}_input"
            if power.exists():
                self.channels.append((label, lambda p=_Value(power): p.read() / 1e6))
            elif volt.exists() and curr.exists():
                self.channels.append((label, lambda v=_Value(volt), c=_Value(curr): v.read() * c.read() / 1e6))
        if not self.channels:
            raise ValueError(f"{device} has no power or current channel")
        inputs = [label for label, _ in self.channels if _INPUT_RAIL.search(label)]
        self.total_of = inputs[:1] or [label for label, _ in self.channels]

    def read(self) -> dict[str, float]:
        out = {label: fn() for label, fn in self.channels}
        out["total"] = sum(out[label] for label in self.total_of)
        return out


def _label(device: Path, i: int) -> str | None:
    for stem in (f"in{i}_label", f"power{i}_label", f"curr{i}_label"):
        if (device / stem).is_file():
            return _text(device / stem)
    return None


def detect_hwmon(root: Path, notes: list[str]) -> list[Sensor]:
    found: list[Sensor] = []
    for device in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        try:
            chip = _text(device / "name")
        except OSError:
            continue
        if chip not in INA_DRIVERS:
            continue
        try:
            monitor = HwmonMonitor(device, chip)
            monitor.read()
            found.append(monitor)
        except (OSError, ValueError) as exc:
            notes.append(f"{chip} at {device} is not readable ({exc}); no energy from it")
    return found


# -- a Raspberry Pi 5's PMIC through vcgencmd ----------------------------------------------------
_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=([-+0-9.eE]+)[AV]\s*$")


def parse_pmic(text: str) -> dict[str, float]:
    """``vcgencmd pmic_read_adc`` as rail -> watts (V x I of every rail with both readings)."""
    amps, volts = {}, {}
    for line in text.splitlines():
        m = _PMIC_LINE.match(line)
        if m:
            (amps if m.group(2) == "A" else volts)[m.group(1)] = float(m.group(3))
    return {rail: volts[rail] * amps[rail] for rail in amps if rail in volts}


class PiPmic:
    """The PMIC rails of a Raspberry Pi 5: their sum, the CPU rail (VDD_CORE) and DRAM's."""

    kind = "power"

    def __init__(self, command: str) -> None:
        self.command = command
        self.name, self.path = "pi5-pmic", f"{command} pmic_read_adc"

    def rails(self) -> dict[str, float]:
        out = subprocess.run([self.command, "pmic_read_adc"], capture_output=True, text=True, timeout=2)
        if out.returncode != 0:
            raise OSError(f"{self.path} exited {out.returncode}: {out.stderr.strip()[:100]}")
        rails = parse_pmic(out.stdout)
        if not rails:
            raise ValueError(f"{self.path} printed no rail with both volts and amps")
        return rails

    def read(self) -> dict[str, float]:
        rails = self.rails()
        return {"total": sum(rails.values()), "cpu": rails.get(PI_CPU_RAIL, 0.0),
                "dram": sum(rails.get(r, 0.0) for r in PI_DRAM_RAILS)}


def detect_pmic(command: str, notes: list[str]) -> list[Sensor]:
    path = shutil.which(command)
    if path is None:
        return []
    pmic = PiPmic(path)
    try:
        pmic.read()
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.debug("no Pi 5 PMIC through %s: %s", path, exc)  # a Pi 4's vcgencmd has no pmic_read_adc
        return []
    return [pmic]


# -- NVIDIA NVML ---------------------------------------------------------------------------------
class Nvml:
    """One GPU: NVML's total-energy counter (Volta and later, millijoules), else its power reading
    (milliwatts), which the sampler integrates."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml, self.index = nvml, index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name, self.path = f"nvml:{index}", f"nvml device {index}"
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.kind = "energy"
        except Exception:
            self.kind = "power"

    def read(self) -> dict[str, float]:
        n = self.nvml
        if self.kind == "energy":
            return {"total": n.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3}
        return {"total": n.nvmlDeviceGetPowerUsage(self.handle) / 1e3}


def detect_nvml(indices: list[int], notes: list[str], nvml: Any = None) -> list[Sensor]:
    if not indices:
        return []
    try:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        nvml.nvmlInit()
    except Exception as exc:
        notes.append(f"NVML is not available ({type(exc).__name__}: {str(exc)[:80]}); no GPU energy")
        return []
    found: list[Sensor] = []
    for i in indices:
        try:
            found.append(Nvml(nvml, i))
        except Exception as exc:
            notes.append(f"NVML device {i} is not readable ({str(exc)[:80]}); no energy from it")
    return found


def detect(root: str | Path = "/", gpus: list[int] | None = None, vcgencmd: str = "vcgencmd",
           nvml: Any = None) -> tuple[list[Sensor], list[str]]:
    """Every sensor of this host (``gpus``: the CUDA device indices this stage uses), and one line
    for each that exists but cannot be read (with the fix where there is one)."""
    root = Path(root)
    notes: list[str] = []
    sensors = (detect_rapl(root, notes) + detect_hwmon(root, notes) + detect_pmic(vcgencmd, notes)
               + detect_nvml(list(gpus or []), notes, nvml))
    return sensors, notes
