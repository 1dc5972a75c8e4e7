"""The engines a stage can run on, by name: eager PyTorch, or an ONNX export of the same stage run
by ONNX Runtime or OpenVINO, as edge devices run a CNN; or, for a language model given as a GGUF,
llama.cpp's RPC split as a peer system (``llamacpp``: its own two processes, both stages). One
``engine`` dimension: a run's engine is a label, one engine for every stage (``onnxruntime``) or
one per stage joined by ``+`` (``onnxruntime+torch``, from ``--stage-engines``).

Torch-free, so ``--help``, the run configuration and the sweep's options read it without torch;
:mod:`paretopipe.partition.onnxstage` exports, checks and runs the stages.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

from .errors import UsageError

TORCH = "torch"
ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
LLAMACPP = "llamacpp"
ENGINES = (TORCH, ONNXRUNTIME, OPENVINO, LLAMACPP)
#: Engines that run every stage as a system of their own (a peer): never one stage of a mix.
PEERS = (LLAMACPP,)
#: The package each engine beyond torch needs (``pip install 'paretopipe[engines]'`` brings both).
PACKAGES = {ONNXRUNTIME: "onnxruntime", OPENVINO: "openvino"}
#: Where a label joins the engines of its stages.
JOIN = "+"


def parse_engines(text: str, flag: str = "--engine") -> list[str]:
    """``torch,onnxruntime`` -> the engine names, each checked (a sweep runs a pass for each)."""
    names = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r}: give an engine: {', '.join(ENGINES)}")
    for name in names:
        if name not in ENGINES:
            raise UsageError(f"{flag} {text!r}: unknown engine {name!r}; valid: {', '.join(ENGINES)}")
    return list(dict.fromkeys(names))


def stage_engines_label(text: str, stages: int | None = None) -> str:
    """``--stage-engines onnxruntime,torch`` -> the label ``onnxruntime+torch`` (one engine per
    stage, in stage order); checked against ``stages`` where the split's stage count is known."""
    names = [part.strip().lower() for part in str(text).split(",")]
    for name in names:
        if name not in ENGINES:
            raise UsageError(f"--stage-engines {text!r}: unknown engine {name!r}; valid: {', '.join(ENGINES)}")
        if name in PEERS:
            raise UsageError(f"--stage-engines {text!r}: {name} runs both stages as a system of its own; give "
                             f"--engine {name}")
    if stages is not None and len(names) != stages:
        raise UsageError(f"--stage-engines {text!r}: give one engine per stage ({stages}), e.g. "
                         f"{','.join([ONNXRUNTIME] + [TORCH] * (stages - 1))}")
    return JOIN.join(names) if len(set(names)) > 1 else names[0]


def label_parts(label: str) -> list[str]:
    """The engines a label names, in stage order (one name: every stage's)."""
    return str(label).split(JOIN)


def check_label(label: str, stages: int) -> None:
    """A run's engine label names known engines, one for all stages or one per stage."""
    parts = label_parts(label)
    if any(p not in ENGINES for p in parts):
        raise UsageError(f"engine {label!r}: valid engines are {', '.join(ENGINES)} (one, or one per stage "
                         f"joined by {JOIN!r})")
    if len(parts) not in (1, stages):
        raise UsageError(f"engine {label!r} names {len(parts)} engines for a {stages}-stage split; give one, "
                         f"or one per stage")
    if len(parts) > 1 and any(p in PEERS for p in parts):
        raise UsageError(f"engine {label!r}: {', '.join(PEERS)} runs every stage itself; give it alone")


def stage_engine(label: str, index: int) -> str:
    """Stage ``index``'s engine (from 0) under a run's engine label."""
    parts = label_parts(label)
    return parts[index] if len(parts) > 1 else parts[0]


def only_torch(label: str) -> bool:
    return all(p == TORCH for p in label_parts(label))


def is_peer(label: str | None) -> bool:
    """Whether a run's engine is a peer system (llama.cpp), not our stages on some engine."""
    return label in PEERS


#: What exporting a stage to ONNX needs beside torch (torch.onnx's exporter imports it).
EXPORTER = "onnx"


def require(engine: str) -> object:
    """The engine's module, imported; an engine whose package (or the exporter's) is missing is
    refused in one line that names it."""
    if engine == TORCH:
        return importlib.import_module("torch")
    if engine == OPENVINO:
        # Importing openvino sends usage telemetry (openvino_telemetry) from a process it forks: a
        # stage must not reach for the network, and a child forked beside a stage worker's stdin
        # reader hangs for ever (found as a sweep's orphaned stage-2 worker). Without the module,
        # openvino uses its own stub, which sends nothing.
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[assignment]
    modules = []
    for package in (PACKAGES[engine], EXPORTER):
        try:
            modules.append(importlib.import_module(package))
        except ImportError:
            raise UsageError(f"--engine {engine}: the {package} package is not installed here; install it with "
                             f"pip install 'paretopipe[engines]' (or pip install {package})") from None
    return modules[0]


def version(engine: str) -> str | None:
    """The installed version of the engine's package (None: not installed)."""
    try:
        return importlib.metadata.version(PACKAGES.get(engine, engine))
    except importlib.metadata.PackageNotFoundError:
        return None


def manifest(engine: str, threads: int | None) -> dict[str, object]:
    """A stage's engine in its manifest, where no export was checked (torch itself)."""
    return {"engine": engine, "version": version(engine), "threads": threads}
