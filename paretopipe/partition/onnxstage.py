"""A stage as an edge device runs it: exported to ONNX once per (model, weights, cuts, stage, batch
size), cached beside the weight cache, checked against the torch stage on the same input, and run
by ONNX Runtime or OpenVINO behind the torch stage's own call (tensors in, tensors out), so the
wire, codecs, faults and records see no difference but the time.

The export is torch's TorchScript exporter at opset 17 (:data:`OPSET`): a partitioned stage is an
FX graph of plain operators that traces in a fraction of a second, where the dynamo exporter takes
seconds a stage. OpenVINO reads the same ONNX file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .. import engines
from ..errors import ParetoPipeError, UsageError
from . import weightcache
from .activation import Activation, live_tensors

log = logging.getLogger("paretopipe.engines")

OPSET = 17
#: Part of an export's cache key: bumped whenever export_onnx writes a different file for the same
#: stage (version 2: the batch axis left free; a file of version 1 fixed it at the export's batch,
#: and a cache that still held one refused LoadGen's single-sample queries).
EXPORT_VERSION = 2
#: An engine stage whose outputs differ from the torch stage's by more than this share of the
#: outputs' scale computes another function, and is refused (float32 engines agree to ~1e-6).
REFUSE_ABOVE = 1e-2
_OPERATOR = re.compile(r"operator '?([\w:.]+)'?")


class EngineExportError(ParetoPipeError):
    """A stage does not export to ONNX (an operator the exporter lacks): the run fails, and a
    sweep records the configuration as failed and goes on."""


@dataclasses.dataclass(frozen=True)
class EngineCheck:
    """What an engine stage is, and how far its outputs are from the torch stage's on the same
    input (``max_rel_error``: the largest absolute difference over the outputs' largest magnitude)."""

    engine: str
    version: str | None
    max_rel_error: float
    threads: int
    export: str          # cache, built or uncached (as the weight cache says)
    export_s: float
    onnx_bytes: int
    opset: int = OPSET

    def manifest(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EngineStage(nn.Module):
    """The stage's ONNX export under an engine, called as the torch stage is. The engine's session
    is opened at the first call, on the thread that computes (a stage's compute thread joins its
    CPU share's group first, and threads the engine starts there stay in it)."""

    def __init__(self, engine: str, path: Path, multi: bool, threads: int) -> None:
        super().__init__()
        self.engine, self.path, self.multi, self.threads = engine, path, multi, threads
        self._run: Callable[[Sequence[np.ndarray]], list[np.ndarray]] | None = None

    def open(self) -> "EngineStage":
        """Open the engine's session now (a profile opens every stage's before its CPU share
        applies: opening is not what it times, and a quarter core made it most of a profile's time)."""
        if self._run is None:
            self._run = open_runner(self.engine, self.path, self.threads)
        return self

    def forward(self, *xs: torch.Tensor) -> Activation:
        self.open()
        arrays = [x.detach().cpu().contiguous().numpy() for x in xs]
        outs = tuple(torch.from_numpy(np.ascontiguousarray(o)) for o in self._run(arrays))
        return outs if self.multi else outs[0]


def open_runner(engine: str, path: Path, threads: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """The engine's session on ``path``: a function from input arrays to output arrays."""
    if engine == engines.ONNXRUNTIME:
        return _onnxruntime_runner(path, threads)
    if engine == engines.OPENVINO:
        return _openvino_runner(path, threads)
    raise UsageError(f"engine {engine!r} runs no ONNX file; valid: {engines.ONNXRUNTIME}, {engines.OPENVINO}")


def _onnxruntime_runner(path: Path, threads: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    session = onnxruntime_session(path, threads)
    names = [i.name for i in session.get_inputs()]
    return lambda arrays: session.run(None, dict(zip(names, arrays)))


def onnxruntime_session(path: Path, threads: int) -> Any:
    """ONNX Runtime's session on ``path``, on ``threads`` intra-op threads, sequential, on the CPU."""
    ort = engines.require(engines.ONNXRUNTIME)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # its warnings about unused initialisers are not the user's
    # Its pool's threads spin between operators by default: under a CPU quota (--stage-cpu, a
    # profile's --cpu-share) the spinning spent the stage's whole budget, and a quarter core ran
    # mobilenet_v2 in 2.5 s instead of about 53 ms.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _openvino_runner(path: Path, threads: int) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    ov = engines.require(engines.OPENVINO)
    # f32 inference: on a CPU with bf16 or fp16 units OpenVINO would otherwise lower the precision.
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                                                          "INFERENCE_PRECISION_HINT": "f32",
                                                          "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        result = request.infer({i: a for i, a in enumerate(arrays)})
        # The request's output buffers are reused by its next call: copy them out.
        return [np.array(result[o], copy=True) for o in outputs]
    return run


def check_device(engine: str, device: str) -> None:
    """An engine stage runs on this node's CPU; a CUDA stage runs torch."""
    if engine != engines.TORCH and device != "cpu":
        raise UsageError(f"--engine {engine} runs a stage on this node's CPU, not on {device}; give the CUDA stage "
                         f"torch (--stage-engines {engine},torch)")


def build(torch_stage: nn.Module, inputs: Activation, engine: str, key: dict[str, Any], what: str
          ) -> tuple[EngineStage, EngineCheck]:
    """``torch_stage`` exported (or found in the cache) and opened under ``engine``, its outputs on
    ``inputs`` compared with the torch stage's. ``key`` names the export (model, weights, cuts,
    stage, batch size); ``what`` names the stage in errors."""
    engines.require(engine)
    torch_stage.eval()  # the exporter puts every child back in the module's own mode afterwards
    xs = live_tensors(inputs)
    with torch.no_grad():
        reference = torch_stage(*xs)
    outs = live_tensors(reference)
    began = time.perf_counter()
    path, how = _exported(torch_stage, xs, len(outs), key, what)
    export_s = time.perf_counter() - began
    threads = torch.get_num_threads()
    got = open_runner(engine, path, threads)([x.numpy() for x in xs])  # a session of its own, for the check
    error = max_rel_error([torch.from_numpy(np.asarray(g)) for g in got], outs)
    if not error <= REFUSE_ABOVE:
        raise EngineExportError(f"{what} under {engine} is off the torch stage by {error:.3g} of the outputs' "
                                f"scale (more than {REFUSE_ABOVE:g}): the export computes another function")
    check = EngineCheck(engine, engines.version(engine), error, threads, how, export_s, path.stat().st_size)
    log.info("%s under %s: export %s in %.2f s, max relative error %.2e", what, engine, how, export_s, error)
    return EngineStage(engine, path, isinstance(reference, tuple), threads), check


def max_rel_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest absolute difference over the reference outputs' largest magnitude."""
    if len(got) != len(want):
        return float("inf")
    diff = max((float((g.float() - w.float()).abs().max()) if w.numel() else 0.0) for g, w in zip(got, want))
    scale = max((float(w.float().abs().max()) if w.numel() else 0.0) for w in want)
    return diff / max(scale, 1e-12)


def _exported(stage: nn.Module, xs: tuple[torch.Tensor, ...], outputs: int, key: dict[str, Any],
              what: str) -> tuple[Path, str]:
    """The stage's ONNX file: from the cache (``engines/`` beside ``weights/``), else exported
    into it under a lock, written to a temporary name and renamed."""
    full = {**key, "torch": torch.__version__, "opset": OPSET, "export": EXPORT_VERSION}
    digest = hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:20]
    root = weightcache.cache_dir()
    folder, how = ((root / "engines", "built") if root is not None
                   else (weightcache.process_scratch("engines"), "uncached"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{weightcache.entry_stem(str(key.get('model', 'stage')), digest, 40)}.onnx"
    if path.is_file():
        return path, "cache"
    from filelock import FileLock

    with FileLock(str(path.with_suffix(".lock")), timeout=weightcache.LOCK_TIMEOUT_S):
        if path.is_file():  # another process exported it while we waited
            return path, "cache"
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.onnx")
        try:
            export_onnx(stage, xs, outputs, tmp, what)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path, how


def export_onnx(stage: nn.Module, xs: tuple[torch.Tensor, ...], outputs: int, path: Path, what: str) -> None:
    """``stage`` on ``xs`` as an ONNX file at :data:`OPSET`; an operator the exporter lacks is
    refused in one line that names the stage and the operator."""
    try:
        with warnings.catch_warnings(), _quiet_native_output(), _mha_decomposed():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, once per stage
            names = [f"input{i}" for i in range(len(xs))] + [f"output{i}" for i in range(outputs)]
            # The batch axis stays free: a stage that finishes a short last batch, or one a fault
            # hands back to stage 1, runs the same file.
            torch.onnx.export(stage, xs, str(path), dynamo=False, opset_version=OPSET, input_names=names[:len(xs)],
                              output_names=names[len(xs):], dynamic_axes={n: {0: "batch"} for n in names},
                              do_constant_folding=True, verbose=False)
    except Exception as exc:  # the exporter raises many kinds; every one means this stage does not export
        text = " ".join(str(exc).split())
        found = _OPERATOR.search(text)
        operator = found.group(1) if found else None
        raise EngineExportError(f"{what} does not export to ONNX (opset {OPSET})"
                                + (f": operator {operator} is not supported" if operator else f": {text[:200]}")) from exc


@contextlib.contextmanager
def _mha_decomposed() -> Iterator[None]:
    """``nn.MultiheadAttention`` as its plain operators while a stage is traced: in eval mode
    without grad it takes torch's fused fast path, ``aten::_native_multi_head_attention``, which
    the TorchScript exporter has no ONNX form of (every stage of a ViT refused to export with it).
    The eager torch stage keeps the fast path; the check before first use compares the two."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@contextlib.contextmanager
def _quiet_native_output() -> Iterator[None]:
    """File descriptors 1 and 2 into a temporary file while the exporter runs: its C++ log, on
    whatever ``verbose`` says (torch 2.14's ``setup_onnx_logging`` tests a function object for
    truth), prints the whole graph to stdout before an unsupported operator's error, which names
    the operator itself."""
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
