"""What one stage spends on a run: energy over its measured window and memory.

Each stage process detects its host's power sensors once, and measures the device's idle power
once, before its first run (a sweep's worker lives for one group of runs, so that is "before each
group"). During a run a sampler reads the sensors at ``RunConfig.energy_rate_hz``; the stage marks
its window, the span in which it handled the run's measured batches (stage 1: the first measured
batch's start to the last one's result; a later stage: the first measured batch's arrival to its
last result sent), and records the window's energy, the process's CPU seconds in it, and the
peak resident memory of the run (reset at its start). The summary's joules per image, measured
or modelled, are computed from this part (:func:`paretopipe.records.summarize`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..energy import memory
from ..energy.sampler import IDLE_S, EnergySampler, idle_power
from ..energy.sensors import Sensor, describe, detect

log = logging.getLogger("paretopipe.energy")
_HOST: dict[str, Any] = {}
_LOCK = threading.Lock()


def host_sensors(device: str) -> tuple[list[Sensor], list[str]]:
    """This host's sensors, detected once per process (the GPU's too on a CUDA stage)."""
    with _LOCK:
        if "sensors" not in _HOST:
            gpus = [int(device.partition(":")[2] or 0)] if device.startswith("cuda") else []
            sensors, notes = detect(gpus=gpus)
            for note in notes:
                log.warning("%s", note)
            _HOST.update(sensors=sensors, notes=notes)
        return _HOST["sensors"], _HOST["notes"]


def host_idle_power(sensors: list[Sensor]) -> dict[str, Any]:
    """The device's idle power, measured once per process before its first run."""
    with _LOCK:
        if "idle" not in _HOST:
            _HOST["idle"] = {"w": idle_power(sensors, IDLE_S) if sensors else {}, "seconds": IDLE_S if sensors else 0.0}
        return _HOST["idle"]


class ResourceMeter:
    """One run of one stage: ``start()``, ``begin()`` and ``end()`` at its window's edges (from
    any of the stage's threads), ``stop()``, then :meth:`part` for the record."""

    def __init__(self, device: str, rate_hz: float, stage_bytes: dict[str, int] | None = None,
                 limit_bytes: int | None = None) -> None:
        self.device, self.rate_hz = device, rate_hz
        self.sensors, self.notes = host_sensors(device)
        self.idle = host_idle_power(self.sensors)
        self.stage_bytes = stage_bytes or {}
        self.limit_bytes = limit_bytes
        self.sampler = EnergySampler(self.sensors, rate_hz) if self.sensors else None
        self.edges: dict[str, tuple[float, float]] = {}
        self.peak_reset = False

    def manifest(self) -> dict[str, Any]:
        """The stage manifest's ``energy_sensors``: every sensor found, by name and path, and why
        any that exists could not be read."""
        return {"sensors": [describe(s) for s in self.sensors], "notes": list(self.notes)}

    def start(self) -> "ResourceMeter":
        self.peak_reset = memory.reset_peak_rss()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        if self.sampler is not None:
            self.sampler.start()
        return self

    def _mark(self, edge: str) -> None:
        self.edges[edge] = (time.monotonic(), time.process_time())

    def begin(self) -> None:
        """The first measured batch entered this stage (kept once)."""
        if "begin" not in self.edges:
            self._mark("begin")

    def end(self) -> None:
        """The latest measured batch left this stage (the last call wins)."""
        self._mark("end")

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def __enter__(self) -> "ResourceMeter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def part(self, images: int) -> dict[str, Any]:
        """This stage's ``resources`` in the run record (see docs/records.md)."""
        peak = memory.peak_rss_bytes()
        mem: dict[str, Any] = {"peak_rss_bytes": peak, "peak_rss_reset": self.peak_reset, **self.stage_bytes,
                               "limit_bytes": self.limit_bytes}
        if self.device.startswith("cuda"):
            import torch

            mem["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        out: dict[str, Any] = {"memory": mem, "images": images}
        if "begin" not in self.edges or "end" not in self.edges:
            return out
        (t0, c0), (t1, c1) = self.edges["begin"], self.edges["end"]
        out.update(window_s=max(0.0, t1 - t0), cpu_s=max(0.0, c1 - c0))
        energy: dict[str, Any] = {"sensors": [describe(s) for s in self.sensors], "notes": list(self.notes),
                                  "rate_hz": self.rate_hz, "idle_w": self.idle["w"], "idle_s": self.idle["seconds"]}
        if self.sampler is not None and t1 > t0:
            energy["window"] = self.sampler.window(t0, t1)
            energy["sampler_cpu_s"] = self.sampler.cpu_s  # the sampling thread's own CPU over the run
        out["energy"] = energy
        return out


def stage_meter(builder: Any, cfg: Any, index: int) -> ResourceMeter:
    """The meter of stage ``index`` (0-based) of a run: its bytes and its memory limit from ``cfg``."""
    limits = cfg.memory_limits or []
    return ResourceMeter(builder.device, cfg.energy_rate_hz, builder.stage_memory(cfg, index),
                         limits[index] if index < len(limits) else None)
