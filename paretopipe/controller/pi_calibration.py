"""The CPU share at which one core of this machine computes as a Raspberry Pi 4 does.

The published figure: PyTorch's tutorial "Real Time Inference on Raspberry Pi 4"
(pytorch/tutorials, ``intermediate_source/realtime_rpi.rst``, Tristan Rice, 2022) measured
float32 ResNet-18 at 100.3 ms a frame of model time on a Raspberry Pi 4 Model B, in eager PyTorch
on the Pi's four cores. Its MobileNetV2 figure (26.4 ms) is of a quantised, scripted model, which
our float32 stages are not, so ResNet-18 sets the share and MobileNetV2's emulated time is
reported beside it. A quota slows compute in proportion (a stage held to share ``s`` computes in
``t / s``), so the share is this core's ResNet-18 time over the Pi's, one thread, pinned.

    python -m paretopipe.controller.pi_calibration --cpus 0 --out calibration.json   # prints the share
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Sequence

from ..options import flags

PI4_RESNET18_S = 0.1003
SOURCE = ("PyTorch tutorial 'Real Time Inference on Raspberry Pi 4' (pytorch/tutorials, intermediate_source/"
          "realtime_rpi.rst): ResNet-18 float32, 100.3 ms model time a frame, Raspberry Pi 4 Model B")
MIN_SHARE, MAX_SHARE = 0.02, 1.0


def whole_model_s(model: str, repetitions: int = 12, warmup: int = 3) -> float:
    """The median time of one 224 x 224 image through the whole model, on this thread."""
    import torch

    from ..partition import models  # lazy for start-up: torch

    net, size = models.build(model), models.input_size(model)  # the model alone: no tracing for cuts
    x = torch.zeros(1, 3, size, size)
    times = []
    with torch.inference_mode():
        for i in range(warmup + repetitions):
            t0 = time.perf_counter()
            net(x)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(threads: int = 1) -> dict:
    """The share, with what it rests on: this core's times and the Pi's."""
    import torch

    torch.set_num_threads(threads)
    resnet18, mobilenet = whole_model_s("resnet18"), whole_model_s("mobilenetv2")
    share = min(MAX_SHARE, max(MIN_SHARE, resnet18 / PI4_RESNET18_S))
    return {"share": round(share, 4), "threads": threads, "source": SOURCE, "pi4_resnet18_s": PI4_RESNET18_S,
            "host_resnet18_s": resnet18, "host_mobilenet_v2_s": mobilenet,
            "emulated_mobilenet_v2_s": mobilenet / share, "emulated_resnet18_s": resnet18 / share}


def yardstick_line() -> str:
    """This core's speed in one line, on the threads already set: a test pass's or a sweep's minutes
    scale with it, and VMs of the same kind have differed twofold (docs/testing.md)."""
    return f"yardstick: MobileNetV2 takes {whole_model_s('mobilenetv2') * 1e3:.1f} ms an image on one thread here"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    flags.CPUS.add_to(p, help="pin to these CPUs first (as the sweep pins stage 1)")
    flags.THREADS.add_to(p, default=1, help="torch threads (stage 1's)")
    flags.OUT.add_to(p, help="write the calibration here as JSON")
    p.add_argument("--yardstick", action="store_true", help="print MobileNetV2's time on one thread and stop "
                   "(make test's first line)")
    args = p.parse_args(argv)
    from ..partition.stages import apply_cpu_limits  # lazy for start-up: torch (--help without it)

    if args.yardstick:
        apply_cpu_limits(args.cpus, 1)
        print(yardstick_line())
        return 0
    apply_cpu_limits(args.cpus, args.threads)
    result = calibrate(args.threads)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(result["share"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
