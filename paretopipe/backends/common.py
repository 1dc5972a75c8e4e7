"""What both backends share: the run configuration and building stages from a model name."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch
from torch import nn

from .. import models, split
from ..errors import UsageError


@dataclasses.dataclass
class RunConfig:
    """One measured run of one split. Both stages must agree on the fields the handshake checks."""

    model: str
    cuts: list[str]
    split_index: int | list[int] | None = None
    batch_size: int = 8
    num_batches: int = 20
    warmup: int = 3
    in_flight: int = 1
    dataset: str = "synthetic"
    data_dir: str | None = None
    num_classes: int = 10
    wire_dtype: str = "float32"
    compression: str = "none"
    compression_level: int = 3
    seed: int = 0
    profile: str | None = None
    link_mode: str = "none"
    network_delay_ms_label: float | None = None
    timeout_s: float = 60.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("batch_size", "in_flight"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("num_batches", "warmup"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be 0 or more")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


class StageBuilder:
    """Builds the model once per process and hands out stages for any cut list (re-partition in place)."""

    def __init__(self, model: str, num_classes: int = 10, weights: str | None = None,
                 models_dir: str | None = None, device: str = "cpu") -> None:
        self.name = models.canonical_name(model)
        self.model = models.build(model, num_classes=num_classes, weights=weights, models_dir=models_dir)
        self.input_size = models.input_size(model)
        self.partitioner = split.Partitioner(self.model, torch.zeros(1, 3, self.input_size, self.input_size),
                                             self.name)
        self.fingerprint = models.fingerprint(self.model)
        self.device = _check_device(device)
        self._cache: dict[tuple[str, ...], list[nn.Module]] = {}
        self._lock = threading.Lock()

    def cuts_for(self, split_index: int | None = None, cut: str | None = None) -> list[str]:
        """The cut list for an anchor block index or a fine cut name."""
        if cut is not None:
            if cut not in (split.INPUT, split.OUTPUT):
                self.partitioner.cut(cut)
            return [cut]
        if split_index is None:
            raise UsageError("give --split-index K or --cut NAME")
        return [self.partitioner.block_cut(split_index)]

    def stage(self, cuts: list[str], index: int) -> nn.Module:
        key = tuple(cuts)
        with self._lock:
            if key not in self._cache:
                stages = self.partitioner.stages(list(cuts))
                self._cache[key] = [s.to(self.device) for s in stages]
            return self._cache[key][index]


def _check_device(device: str) -> str:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asked for but CUDA is not available on this node; use cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N")
    return device


class StageTimer:
    """Times stage compute on this node: perf_counter on CPU, synchronised around CUDA work."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def run(self, stage: nn.Module, x: torch.Tensor, device: str) -> tuple[torch.Tensor, float]:
        import time

        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            with torch.no_grad():
                out = stage(x.to(device, non_blocking=True))
            end.record()
            end.synchronize()
            # Events time the GPU work; the wall clock includes the host-to-device copy too.
            return out, max(time.perf_counter() - t0, start.elapsed_time(end) / 1e3)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = stage(x)
        return out, time.perf_counter() - t0
