"""Stages from a model name: build the model once per process, partition it for any cut list, time a stage."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch import nn

from .. import allocator, engines
from ..errors import UsageError
from . import fxcuts, models, onnxstage
from .activation import Activation, call_stage
from .names import DEFAULT_NUM_CLASSES


class StageBuilder:
    """Builds the model once per process and hands out stages for any cut list (re-partition in place)."""

    def __init__(self, model: str, num_classes: int = DEFAULT_NUM_CLASSES, weights: str | None = None,
                 models_dir: str | None = None, device: str = "cpu") -> None:
        # Every process that computes a stage (a stage, a rank, a profile) builds one of these:
        # here its activations get the same allocator path whatever the process did before.
        allocator.keep_activations_in_heap()
        self.name = models.canonical_name(model)
        self.num_classes = num_classes
        self.model = models.build(model, num_classes=num_classes, weights=weights, models_dir=models_dir)
        self.input_size = models.input_size(model)
        self.partitioner = fxcuts.Partitioner(self.model, torch.zeros(1, 3, self.input_size, self.input_size),
                                             self.name)
        self.fingerprint = models.fingerprint(self.model)
        self.device = _check_device(device)
        self._cache: dict[tuple[str, ...], list[nn.Module]] = {}
        self._engine_stages: dict[tuple, nn.Module] = {}
        self.engine_checks: dict[tuple, onnxstage.EngineCheck] = {}  # per (cuts, stage, engine, batch)
        self.timings: dict[tuple, dict] = {}  # this node's measured segment times, kept for the process
        self._lock = threading.Lock()

    def cuts_for(self, split_index: int | None = None, cut: str | None = None) -> list[str]:
        """The cut list for an anchor block index, or for fine cut names (a comma list plans a chain;
        a name with ``+`` is a live set of several tensors)."""
        if cut is not None:
            names = [c.strip() for c in cut.split(",")]
            positions = [self.partitioner.stage_position(c) for c in names]
            if positions != sorted(positions):
                raise UsageError(f"--cut {cut}: cuts must be in graph order (python -m paretopipe.split --list "
                                 f"--fine shows it)")
            return names
        if split_index is None:
            raise UsageError("give --split-index K or --cut NAME")
        return [self.partitioner.block_cut(split_index)]

    def stage_bytes(self, cuts: list[str], index: int, batch: int) -> dict[str, int]:
        """What stage ``index`` holds whatever it runs (its parameters and buffers) and its largest
        activation at ``batch`` images; summed over every stage of a split, the parameters and
        buffers are the whole model's."""
        stage = self.stage(cuts, index)
        params = sum(p.numel() * p.element_size() for p in stage.parameters())
        buffers = sum(b.numel() * b.element_size() for b in stage.buffers())
        return {"param_bytes": params + buffers, "activation_peak_bytes":
                self.partitioner.activation_peak_nbytes(cuts, index, batch)}

    def stage_memory(self, cfg: Any, index: int) -> dict[str, int]:
        """What stage ``index`` of a run holds (:meth:`stage_bytes` at the run's batch size)."""
        return self.stage_bytes(list(cfg.cuts), index, cfg.batch_size)

    def stage(self, cuts: list[str], index: int) -> nn.Module:
        key = tuple(cuts)
        with self._lock:
            if key not in self._cache:
                stages = self.partitioner.stages(list(cuts))
                # eval() on each stage itself: a detector's wrapper was built in training mode, and the
                # ONNX exporter restores a module's own mode to all its children after an export.
                self._cache[key] = [s.to(self.device).eval() for s in stages]
            return self._cache[key][index]

    def engine_stage(self, cuts: list[str], index: int, engine: str, batch: int) -> nn.Module:
        """Stage ``index`` as ``engine`` runs it: the torch stage itself, or its ONNX export
        (once per process and batch size, checked against the torch stage: :attr:`engine_checks`)."""
        if engine == engines.TORCH:
            return self.stage(cuts, index)
        onnxstage.check_device(engine, self.device)
        key = (tuple(cuts), index, engine, batch)
        if key not in self._engine_stages:
            x: Any = self.example_batch(batch)
            with torch.no_grad():
                for j in range(index):
                    x = call_stage(self.stage(cuts, j), x)
            what = f"stage {index + 1} of {self.name} split at {','.join(cuts)}" if cuts else f"the whole {self.name}"
            export_key = {"model": self.name, "fingerprint": self.fingerprint, "cuts": list(cuts), "stage": index,
                          "batch": batch}
            stage, check = onnxstage.build(self.stage(cuts, index), x, engine, export_key, what)
            self._engine_stages[key], self.engine_checks[key] = stage, check
        return self._engine_stages[key]

    def stage_for(self, cfg: Any, index: int) -> nn.Module:
        """Stage ``index`` of a run (its cuts, its engine label and batch size: a RunConfig)."""
        return self.engine_stage(list(cfg.cuts), index, engines.stage_engine(cfg.engine, index), cfg.batch_size)

    def adaptive_boundaries(self, cfg: Any) -> list[str]:
        """The cuts an adaptive run may split at, the model's input and output included: every
        block cut and the run's candidates named by cut (both stages derive them from the RUN)."""
        named = (cfg.adaptive_split.candidates if cfg.adaptive_split else None) or []
        return self.partitioner.boundary_cuts([c for c in named if isinstance(c, str)])

    def engine_of(self, cfg: Any, index: int) -> dict[str, Any]:
        """The manifest's account of the engine stage ``index`` of a run computed on (an adaptive
        run's: over the segments between its boundaries, which it ran)."""
        engine = engines.stage_engine(cfg.engine, index)
        if cfg.adaptive:
            return SegmentChains(self, self.adaptive_boundaries(cfg), engine, cfg.batch_size).engine_manifest()
        check = self.engine_checks.get((tuple(cfg.cuts), index, engine, cfg.batch_size))
        return check.manifest() if check else engines.manifest(engine, torch.get_num_threads())

    def example_batch(self, batch: int) -> torch.Tensor:
        """A seeded input batch of the model's size: what an engine stage is exported and checked on."""
        generator = torch.Generator().manual_seed(batch)
        return torch.randn(batch, 3, self.input_size, self.input_size, generator=generator)


def _check_device(device: str) -> str:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asked for but CUDA is not available on this node; use cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"unknown device {device!r}; valid: cpu, cuda, cuda:N")
    return device


class StageTimer:
    """Times stage compute on this node: perf_counter on CPU; on CUDA, events recorded on the
    stream around the host-to-device copy and around the stage, after which the stage's output is
    synchronised. The time of a CUDA stage is the events' (the copy and the compute, as the GPU
    ran them); ``last_copy_s`` is the copy's share and ``last_wall_s`` the wall clock around the
    whole synchronised call, for checking one against the other."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.last_copy_s = 0.0
        self.last_wall_s = 0.0

    def run(self, stage: nn.Module, x: Activation, device: str) -> tuple[Activation, float]:
        """``stage`` on ``x`` (one tensor, or the live set of a cut where several cross) and its time."""
        adopt_torch_threads()
        if self.cuda:
            return self._run_cuda(stage, x, device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = call_stage(stage, x)
        self.last_wall_s = time.perf_counter() - t0
        return out, self.last_wall_s

    def _run_cuda(self, stage: nn.Module, x: Activation, device: str) -> tuple[Activation, float]:
        begin, copied, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        begin.record()
        with torch.no_grad():
            moved = tuple(t.to(device, non_blocking=True) for t in x) if isinstance(x, tuple) \
                else x.to(device, non_blocking=True)
            copied.record()
            out = call_stage(stage, moved)
        end.record()
        end.synchronize()
        self.last_wall_s = time.perf_counter() - t0
        self.last_copy_s = begin.elapsed_time(copied) / 1e3
        return out, begin.elapsed_time(end) / 1e3


class TimedChain(nn.Module):
    """Consecutive segments of a model run one after another, each one timed: what a stage of an
    adaptive run computes, so that it observes its per-segment compute on every batch. The chain
    of segments ``first``.. gives the same outputs as the stage between the same cuts (the cuts
    are exact); ``times`` holds the last call's seconds per segment, and with ``keep_inputs`` the
    activation each segment took, and the last one's output, for re-timing between batches."""

    def __init__(self, segments: list[nn.Module], first: int, cuda: bool = False, keep_inputs: bool = False) -> None:
        super().__init__()
        self.segments = nn.ModuleList(segments)
        self.first, self.cuda, self.keep_inputs = first, cuda, keep_inputs
        self.times: list[float] = []
        self.inputs: list[Activation] = []

    def forward(self, *args: torch.Tensor) -> Activation:
        x: Activation = args[0] if len(args) == 1 else tuple(args)  # a live set arrives as arguments
        times, inputs = [], []
        for seg in self.segments:
            if self.keep_inputs:
                inputs.append(x)
            t0 = time.perf_counter()
            x = call_stage(seg, x)
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        self.times = times
        self.inputs = inputs + [x] if self.keep_inputs else []
        return x


class SegmentChains:
    """The segments between an adaptive run's boundaries (``boundaries``: every cut it may split
    at, the model's input and output included), and the chain each stage runs for a split. Under
    an engine each segment is its own export (checked against the torch segment), so that a
    stage times each one and may switch between cuts per batch: an engine does not fuse across
    a boundary the run may split at."""

    def __init__(self, builder: StageBuilder, boundaries: list[str], engine: str = engines.TORCH,
                 batch: int = 1) -> None:
        self.builder, self.boundaries = builder, list(boundaries)
        self.engine, self.batch = engine, batch
        self.interior = self.boundaries[1:-1]
        self.count = len(self.boundaries) - 1
        self._chains: dict[tuple[str, int], TimedChain] = {}

    def segment(self, j: int) -> nn.Module:
        return self.builder.engine_stage(self.interior, j, self.engine, self.batch)

    def engine_manifest(self) -> dict[str, Any]:
        """The engine the segments ran on, and (an export's) the largest error of those exported."""
        checks = [c for (cuts, _, engine, batch), c in self.builder.engine_checks.items()
                  if cuts == tuple(self.interior) and engine == self.engine and batch == self.batch]
        if not checks:
            return engines.manifest(self.engine, torch.get_num_threads())
        worst = max(checks, key=lambda c: c.max_rel_error)
        return {**worst.manifest(), "segments_exported": len(checks)}

    def chain(self, cut: str, side: int, keep_inputs: bool = False) -> TimedChain:
        """Stage 1's part (``side`` 0: the segments before ``cut``) or stage 2's (1: from it on)."""
        key = (cut, side)
        if key not in self._chains:
            b = self.boundaries.index(cut)
            js = range(0, b) if side == 0 else range(b, self.count)
            self._chains[key] = TimedChain([self.segment(j) for j in js], js.start,
                                           self.builder.device.startswith("cuda"), keep_inputs)
        return self._chains[key]

    def retime(self, first: int, x: Activation, count: int, repetitions: int = 3) -> list[float]:
        """Segments ``first``.. (``count`` of them, chained from ``x``, segment ``first``'s input)
        run again: each one's median over ``repetitions`` passes (a re-profile)."""
        import statistics

        timer = StageTimer(self.builder.device)
        passes = []
        for _ in range(repetitions):
            y, times = x, []
            for j in range(first, first + count):
                y, t = timer.run(self.segment(j), y, self.builder.device)
                times.append(t)
            passes.append(times)
        return [float(statistics.median(p[i] for p in passes)) for i in range(count)]


def time_segments(builder: StageBuilder, cuts: list[str], x: torch.Tensor, repetitions: int = 8,
                  warmup: int = 2, engine: str = engines.TORCH) -> dict[str, float | list[float]]:
    """Each segment's compute between consecutive ``cuts`` (interior cuts, in order) and the whole
    model's, as means of interleaved repetitions on this node, under ``engine``: the brief
    self-profile an adaptive run starts with. Means, because under a CPU quota single calls are
    either full speed or frozen and only means add up across segments (as in ``paretopipe profile
    --cpu-share``). ``call_overhead_s`` is what chaining costs beyond one call, as in a full profile."""
    import statistics

    chains = SegmentChains(builder, ["input", *cuts, "output"], engine, int(x.shape[0]))
    segments = [chains.segment(j) for j in range(chains.count)]
    whole_model = builder.model if engine == engines.TORCH else builder.engine_stage([], 0, engine, int(x.shape[0]))
    timer = StageTimer(builder.device)
    x = x.to(builder.device)
    runs, whole = [], []
    for rep in range(warmup + repetitions):
        y, times = x, []
        for seg in segments:
            y, t = timer.run(seg, y, builder.device)
            times.append(t)
        _, t_whole = timer.run(whole_model, x, builder.device)
        if rep >= warmup:  # interleaved, so drift hits segments and the whole model alike
            runs.append(times)
            whole.append(t_whole)
    segs = [float(statistics.fmean(r[i] for r in runs)) for i in range(len(segments))]
    whole_s = float(statistics.fmean(whole))
    return {"segment_compute_s": segs, "whole_model_s": whole_s,
            "call_overhead_s": max(0.0, (sum(segs) - whole_s) / max(1, len(segs) - 1)),
            "repetitions": repetitions, "statistic": "mean"}


def adopt_torch_threads() -> int:
    """Give the calling thread the process's torch thread count, and return it.

    OpenMP's thread count and MKL's local one belong to each thread: a thread started after
    ``torch.set_num_threads`` keeps the defaults, sized by the CPUs the process could see at start.
    torch applies its count to a thread lazily, at the thread's first parallel operator, so a
    stage of GEMMs alone (a classifier head: flatten and a linear layer) ran MKL on two OpenMP
    threads inside a process pinned to one core, and took 8 ms instead of 5 us. Asking torch for
    the count applies it here; it costs a fraction of a microsecond once applied."""
    return torch.get_num_threads()


def apply_cpu_limits(cpus: str | None, threads: int | None) -> dict:
    """Pin this process to ``cpus`` (e.g. "0" or "0-1") and set torch threads; returns what was applied."""
    import os

    applied: dict = {}
    if cpus:
        wanted: set[int] = set()
        try:
            for part in cpus.split(","):
                lo, _, hi = part.partition("-")
                wanted.update(range(int(lo), int(hi or lo) + 1))
            os.sched_setaffinity(0, wanted)
        except (ValueError, OSError) as exc:
            have = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            raise UsageError(f"--cpus {cpus!r}: {getattr(exc, 'strerror', None) or 'not a CPU list'}; "
                             f"give a list such as 0 or 0-1 of the CPUs here ({have})")
        applied["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads {threads}: must be a positive number of torch threads")
        torch.set_num_threads(threads)
    applied["torch_threads"] = torch.get_num_threads()
    return applied
