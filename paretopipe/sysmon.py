"""System metrics sampled by a background thread, off the timed path.

CPU % and peak RSS of this process (psutil), GPU utilisation/memory/power/energy where NVML is
present (nvidia-ml-py), CPU temperature and frequency from sysfs where readable, and throttling:
a Raspberry Pi's ``vcgencmd get_throttled`` flags, or a frequency below the CPU's maximum
(cpufreq). Anything that cannot be measured is ``None``; nothing is estimated.
"""

from __future__ import annotations

import glob
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

import psutil


def _read_float(path: str, scale: float) -> float | None:
    try:
        with open(path) as fh:
            return float(fh.read().strip()) * scale
    except (OSError, ValueError):
        return None


def cpu_temperature_c() -> float | None:
    temps = [t for t in (_read_float(p, 1e-3) for p in glob.glob("/sys/class/thermal/thermal_zone*/temp"))
             if t is not None]
    return max(temps) if temps else None


def cpu_frequency_mhz() -> float | None:
    freqs = [f for f in (_read_float(p, 1e-3) for p in
                         glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"))
             if f is not None]
    return statistics.fmean(freqs) if freqs else None


def cpu_max_frequency_mhz() -> float | None:
    freqs = [f for f in (_read_float(p, 1e-3) for p in
                         glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/cpuinfo_max_freq")) if f is not None]
    return max(freqs) if freqs else None


#: get_throttled bits that mean "now": under-voltage, frequency capped, throttled, soft temperature
#: limit (bits 16-19 say the same happened since boot).
THROTTLED_NOW = 0xF


def pi_throttled_flags() -> int | None:
    """``vcgencmd get_throttled`` on a Raspberry Pi (``throttled=0x50005``), else None."""
    if shutil.which("vcgencmd") is None:
        return None
    try:
        out = subprocess.run(["vcgencmd", "get_throttled"], capture_output=True, text=True, timeout=2).stdout
        return int(out.strip().split("=", 1)[1], 16)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


class _Nvml:
    def __init__(self, index: int = 0) -> None:
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self.handle = None

    def sample(self) -> dict[str, float | None]:
        if self.handle is None:
            return {}
        n = self.nvml
        out: dict[str, float | None] = {}
        for key, fn in (("util", lambda: n.nvmlDeviceGetUtilizationRates(self.handle).gpu),
                        ("mem", lambda: n.nvmlDeviceGetMemoryInfo(self.handle).used),
                        ("power", lambda: n.nvmlDeviceGetPowerUsage(self.handle) / 1e3),
                        ("energy", lambda: n.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3)):
            try:
                out[key] = float(fn())
            except Exception:
                out[key] = None
        return out


class SystemMonitor:
    """``with SystemMonitor() as mon: ...`` then ``mon.summary()``."""

    def __init__(self, interval_s: float = 0.2, gpu: bool = False) -> None:
        self.interval_s = interval_s
        self.proc = psutil.Process()
        self.gpu = _Nvml() if gpu else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu: list[float] = []
        self.rss_peak = 0
        self.temps: list[float] = []
        self.freqs: list[float] = []
        self.gpu_samples: list[dict[str, float | None]] = []
        self.started = self.stopped = 0.0
        self.max_freq = cpu_max_frequency_mhz()
        self.throttle_flags: list[int] = []

    def _loop(self) -> None:
        self.proc.cpu_percent(None)
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        try:
            self.cpu.append(self.proc.cpu_percent(None))
            self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)
        except psutil.Error:
            pass
        t, f = cpu_temperature_c(), cpu_frequency_mhz()
        if t is not None:
            self.temps.append(t)
        if f is not None:
            self.freqs.append(f)
        if self.gpu is not None:
            s = self.gpu.sample()
            if s:
                self.gpu_samples.append(s)

    def _throttle_sample(self) -> None:
        flags = pi_throttled_flags()
        if flags is not None:
            self.throttle_flags.append(flags)

    def __enter__(self) -> "SystemMonitor":
        self._throttle_sample()
        self.started = time.monotonic()
        self.rss_peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._loop, name="sysmon", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=2)
            self.sample()
            self.stopped = time.monotonic()
            self._throttle_sample()

    def summary(self) -> dict[str, Any]:
        def mean(xs):
            xs = [x for x in xs if x is not None]
            return round(statistics.fmean(xs), 3) if xs else None

        gpu = self.gpu_samples
        energy = [s.get("energy") for s in gpu if s.get("energy") is not None]
        mems = [s["mem"] for s in gpu if s.get("mem") is not None]
        flags = 0
        for f in self.throttle_flags:
            flags |= f
        capped = (min(self.freqs) < 0.9 * self.max_freq) if self.freqs and self.max_freq else None
        pi_now = bool(flags & THROTTLED_NOW) if self.throttle_flags else None
        throttled = None if capped is None and pi_now is None else bool(capped or pi_now)
        return {
            "cpu_percent_mean": mean(self.cpu[1:] or self.cpu),
            "rss_peak_bytes": self.rss_peak or None,
            "cpu_temperature_c_max": max(self.temps) if self.temps else None,
            "cpu_frequency_mhz_mean": mean(self.freqs),
            "cpu_frequency_mhz_min": min(self.freqs) if self.freqs else None,
            "cpu_frequency_mhz_max_rated": self.max_freq,
            "throttle_flags": hex(flags) if self.throttle_flags else None,
            "throttled": throttled,
            "gpu_utilization_percent_mean": mean([s.get("util") for s in gpu]),
            "gpu_memory_peak_bytes": max(mems) if mems else None,
            "gpu_power_w_mean": mean([s.get("power") for s in gpu]),
            "gpu_energy_j": round(energy[-1] - energy[0], 3) if len(energy) >= 2 else None,
            "samples": len(self.cpu),
        }
