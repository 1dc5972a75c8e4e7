"""The power-sensor readers against fixture trees and a fake ``vcgencmd``. This machine has no
RAPL, hwmon power monitor, PMIC or GPU, so these fakes stand in for the kernel's files and the
Pi's tool (the one place the suite fakes a component): the files and the script have the formats
the real ones have, and a helper thread moves the counters in real time."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from paretopipe.energy import sensors
from paretopipe.energy.sampler import EnergySampler

# A Raspberry Pi 5's ``vcgencmd pmic_read_adc`` (trimmed: the format of every line is kept).
PMIC = """\
     3V7_WL_SW_A current(0)=0.00390372A
       3V3_SYS_A current(1)=0.05562960A
      DDR_VDD2_A current(4)=0.10541700A
      DDR_VDDQ_A current(5)=0.00195186A
       VDD_CORE_A current(7)={core_a:.8f}A
     3V7_WL_SW_V volt(8)=3.71983800V
       3V3_SYS_V volt(9)=3.31103100V
      DDR_VDD2_V volt(12)=1.10488000V
      DDR_VDDQ_V volt(13)=0.60048780V
       VDD_CORE_V volt(15)=0.72000000V
        EXT5V_V volt(24)=5.15570000V
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rapl_tree(root: Path, package_uj: int = 1_000_000, dram_uj: int = 500_000, max_uj: int = 2_000_000) -> Path:
    for zone, name, uj in (("intel-rapl:0", "package-0", package_uj), ("intel-rapl:0:0", "core", package_uj // 2),
                           ("intel-rapl:0:1", "dram", dram_uj)):
        _write(root / f"sys/class/powercap/{zone}/name", f"{name}\n")
        _write(root / f"sys/class/powercap/{zone}/energy_uj", f"{uj}\n")
        _write(root / f"sys/class/powercap/{zone}/max_energy_range_uj", f"{max_uj}\n")
    return root / "sys/class/powercap"


def test_rapl_sums_packages_and_dram_and_unwraps_the_counter(tmp_path):
    base = rapl_tree(tmp_path)
    found, notes = sensors.detect(tmp_path, vcgencmd="no-such-vcgencmd")
    assert notes == [] and [s.name for s in found] == ["rapl"]
    rapl = found[0]
    first = rapl.read()
    assert first["total"] == pytest.approx(1.0 + 0.5) and first["core"] == pytest.approx(0.5)
    # The package counter passes its range (2 J) and starts again: 1.0 -> 1.9 -> 0.3 is 1.3 J more.
    (base / "intel-rapl:0/energy_uj").write_text("1900000\n")
    rapl.read()
    (base / "intel-rapl:0/energy_uj").write_text("300000\n")
    assert rapl.read()["package-0"] - first["package-0"] == pytest.approx(1.3)


def test_rapl_readable_by_root_only_is_one_line_naming_the_udev_fix(tmp_path, monkeypatch):
    base = rapl_tree(tmp_path)
    denied = base / "intel-rapl:0/energy_uj"
    if os.geteuid() == 0:  # root opens any file: deny this one as the kernel denies it to a user
        real = os.open

        def open_(path, *a, **k):
            if Path(path) == denied:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *a, **k)
        monkeypatch.setattr(os, "open", open_)
    else:
        denied.chmod(0)
    found, notes = sensors.detect(tmp_path, vcgencmd="no-such-vcgencmd")
    assert found == [] and len(notes) == 1
    assert f"RAPL {denied} is readable by root only" in notes[0] and 'SUBSYSTEM=="powercap"' in notes[0]


def test_a_missing_rapl_file_is_named_and_nothing_is_measured(tmp_path):
    base = rapl_tree(tmp_path)
    (base / "intel-rapl:0/max_energy_range_uj").unlink()
    found, notes = sensors.detect(tmp_path, vcgencmd="no-such-vcgencmd")
    assert found == [] and len(notes) == 1 and "max_energy_range_uj" in notes[0] and "not usable" in notes[0]


def hwmon_tree(root: Path) -> None:
    # A Jetson's INA3221: three rails, bus millivolts and milliamps, the first the board's input.
    jetson = root / "sys/class/hwmon/hwmon1"
    _write(jetson / "name", "ina3221\n")
    for i, (label, mv, ma) in enumerate((("VDD_IN", 5000, 1200), ("VDD_CPU_GPU_CV", 5000, 400),
                                         ("VDD_SOC", 5000, 300)), start=1):
        _write(jetson / f"in{i}_label", f"{label}\n")
        _write(jetson / f"in{i}_input", f"{mv}\n")
        _write(jetson / f"curr{i}_input", f"{ma}\n")
    # A Pi 4 with an INA219 board: one channel with its power in microwatts.
    pi = root / "sys/class/hwmon/hwmon2"
    _write(pi / "name", "ina219\n")
    _write(pi / "in0_input", "3\n")       # shunt millivolts: not a channel of its own
    _write(pi / "in1_input", "5100\n")
    _write(pi / "curr1_input", "640\n")
    _write(pi / "power1_input", "3264000\n")
    _write(root / "sys/class/hwmon/hwmon0/name", "coretemp\n")  # not a power monitor


def test_hwmon_ina3221_total_is_its_input_rail_and_ina219_its_power(tmp_path):
    hwmon_tree(tmp_path)
    found, notes = sensors.detect(tmp_path, vcgencmd="no-such-vcgencmd")
    assert notes == [] and [s.name for s in found] == ["hwmon:ina3221", "hwmon:ina219"]
    jetson, pi = (s.read() for s in found)
    assert jetson == pytest.approx({"VDD_IN": 6.0, "VDD_CPU_GPU_CV": 2.0, "VDD_SOC": 1.5, "total": 6.0})
    assert pi == pytest.approx({"channel1": 3.264, "total": 3.264})


class FakeVcgencmd:
    """A ``vcgencmd`` on PATH that prints a Pi 5's PMIC readings from a state file, which a helper
    thread changes in real time (the core current steps up at ``step_at`` seconds), until ``stop_at``,
    from which it exits with an error, as a tool that stopped answering would."""

    def __init__(self, folder: Path, step_at: float = 0.3, stop_at: float | None = None) -> None:
        self.state = folder / "core_a"
        self.state.write_text("1.0")
        self.path = folder / "vcgencmd"
        self.path.write_text("#!/bin/sh\n"
                             f"[ -f {folder}/dead ] && {{ echo 'VCHI initialization failed' >&2; exit 1; }}\n"
                             f"a=$(cat {self.state})\n"
                             f"printf '{PMIC.replace('{core_a:.8f}', '%s')}' \"$a\"\n")
        self.path.chmod(self.path.stat().st_mode | stat.S_IEXEC)
        self.folder, self.step_at, self.stop_at = folder, step_at, stop_at
        self.thread = threading.Thread(target=self._advance, daemon=True)
        self.started = time.monotonic()
        self.thread.start()

    def _advance(self) -> None:
        time.sleep(self.step_at)
        self.state.write_text("3.0")  # VDD_CORE from 0.72 W to 2.16 W
        if self.stop_at is not None:
            time.sleep(max(0.0, self.stop_at - self.step_at))
            (self.folder / "dead").write_text("")


def test_pi5_pmic_rails_and_the_cpu_and_dram_parts():
    rails = sensors.parse_pmic(PMIC.format(core_a=1.0))
    assert rails["VDD_CORE"] == pytest.approx(0.72) and "EXT5V" not in rails  # volts only: not a rail
    assert set(rails) == {"3V7_WL_SW", "3V3_SYS", "DDR_VDD2", "DDR_VDDQ", "VDD_CORE"}


def test_pi5_pmic_through_a_fake_vcgencmd_is_integrated_in_real_time(tmp_path):
    fake = FakeVcgencmd(tmp_path, step_at=0.3)
    found, notes = sensors.detect(tmp_path / "no-root", vcgencmd=str(fake.path))
    assert [s.name for s in found] == ["pi5-pmic"] and notes == []
    other = sum(v for k, v in sensors.parse_pmic(PMIC.format(core_a=0.0)).items())
    with EnergySampler(found, rate_hz=50) as sampler:
        t0 = time.monotonic()
        time.sleep(0.6)
        t1 = time.monotonic()
    w = sampler.window(t0, t1)["pi5-pmic"]
    step = fake.started + 0.3
    # 0.72 W before the step and 2.16 W after it on the core rail, the other rails constant; the
    # integral of samples every 20 ms is within one sample period of the step of the true value.
    expected_core = 0.72 * (step - t0) + 2.16 * (t1 - step)
    assert w["joules"]["cpu"] == pytest.approx(expected_core, abs=2.16 * 0.05)
    assert w["joules"]["total"] == pytest.approx(expected_core + other * (t1 - t0), abs=2.16 * 0.05)
    assert w["joules"]["dram"] == pytest.approx((1.10488 * 0.105417 + 0.6004878 * 0.00195186) * (t1 - t0), rel=1e-6)
    assert w["samples"] >= 10


def test_a_sensor_that_stops_mid_run_gives_no_figure_and_says_when(tmp_path):
    fake = FakeVcgencmd(tmp_path, step_at=0.1, stop_at=0.3)
    found, _ = sensors.detect(tmp_path / "no-root", vcgencmd=str(fake.path))
    with EnergySampler(found, rate_hz=50) as sampler:
        t0 = time.monotonic()
        time.sleep(0.6)
        t1 = time.monotonic()
    w = sampler.window(t0, t1)["pi5-pmic"]
    assert w["joules"] is None and "stopped answering" in w["reason"] and "exited 1" in w["reason"]
    early = sampler.window(t0, t0 + 0.15)["pi5-pmic"]  # a window before it stopped still has its figure
    assert early["joules"] is not None


def test_no_sensor_and_a_missing_tree_give_nothing(tmp_path):
    assert sensors.detect(tmp_path, vcgencmd="no-such-vcgencmd") == ([], [])


class FakeNvml:
    """nvidia-ml-py's calls for one GPU (there is none here): an energy counter in mJ, or only power."""

    def __init__(self, energy: bool) -> None:
        self.energy, self.mj, self.mw = energy, 10_000, 250_000

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        self.mj += 5_000
        return self.mj

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.mw


@pytest.mark.parametrize("energy", [True, False])
def test_nvml_reads_the_energy_counter_else_power(energy):
    found, notes = sensors.detect("/nonexistent", gpus=[0], vcgencmd="no-such-vcgencmd", nvml=FakeNvml(energy))
    (gpu,) = found
    assert notes == [] and gpu.name == "nvml:0" and gpu.kind == ("energy" if energy else "power")
    first, second = gpu.read()["total"], gpu.read()["total"]
    assert (second - first == pytest.approx(5.0)) if energy else (first == second == pytest.approx(250.0))
