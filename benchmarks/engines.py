#!/usr/bin/env python3
"""Each engine beside eager PyTorch, measured side by side in one process (paretopipe.engines).

For each model: the whole model's compute and each block segment's, per engine, at batch 1 and 8,
on one thread and one core; the ratio to torch's time measured in the same interleaved rounds; and
the largest error of the engine's outputs against torch's, relative to the outputs' scale. The
engines run the same ONNX export of each stage (TorchScript exporter, opset 17), cached beside the
weights, so a second run times without exporting.

    python benchmarks/engines.py                                  # mobilenetv2 resnet18 efficientnet_b0 ssdlite
    python benchmarks/engines.py --models mobilenetv2 --batch-sizes 1 --rounds 10
    PARETOPIPE_CACHE_DIR=/tmp/check python benchmarks/engines.py --classifiers   # every classifier's block splits

``--classifiers`` checks, under ONNX Runtime, every block split of every torchvision classifier
against the unsplit torch model (the issue's 1e-4 bound) and lists the stages that do not export,
with the operator each stops at. A model whose largest error passes the bound also gets both
float32 results' error against the model in float64, on the same scale: the unsplit torch model's
and the engine's at its worst split. Where the two are alike, the engine is as close to exact
arithmetic as torch is, and its distance from torch is float32's own rounding. It deletes each split's exports from the cache folder after the split: give it a
cache folder of its own (``PARETOPIPE_CACHE_DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from paretopipe import engines
from paretopipe.partition import onnxstage
from paretopipe.partition.activation import call_stage, live_tensors
from paretopipe.partition.stages import StageBuilder

MODELS = ["mobilenetv2", "resnet18", "efficientnet_b0", "ssdlite320_mobilenet_v3_large"]
ENGINES = [e for e in engines.ENGINES if engines.version(e)]


#: The issue's bound on an engine's error against torch, relative to the logits' scale.
BOUND = 1e-4


def _time(stage, x, rounds: int) -> list[float]:
    out = []
    with torch.no_grad():
        for _ in range(rounds):
            t0 = time.perf_counter()
            call_stage(stage, x)
            out.append(time.perf_counter() - t0)
    return out


def whole_and_segments(name: str, batch: int, rounds: int) -> list[dict]:
    """Per engine: the whole model's median, the sum of its block segments' medians, the largest
    error over the whole model and every segment (rounds interleaved across engines)."""
    b = StageBuilder(name)
    part = b.partitioner
    cuts = [part.block_cut(k) for k in range(1, part.num_blocks)]
    x = b.example_batch(batch)
    inputs, y = [], x
    with torch.no_grad():
        for i in range(len(cuts) + 1):
            inputs.append(y)
            y = call_stage(b.stage(cuts, i), y)
    error: dict[str, float] = {}
    whole_ok: dict[str, bool] = {}
    for e in ENGINES:  # export, check and warm up every stage first
        try:
            error[e] = max(_checked(b, cuts, i, e, batch) for i in range(len(inputs)))
        except onnxstage.EngineExportError as exc:
            print(f"{b.name} batch {batch} under {e}: {exc}", flush=True)
            continue
        try:  # a detector's whole model (transform, body, NMS in one graph) may not export faithfully
            error[e] = max(error[e], _checked(b, [], 0, e, batch))
            whole_ok[e] = True
        except onnxstage.EngineExportError as exc:
            print(f"{b.name} batch {batch} under {e}: {exc}; its segments are timed", flush=True)
            whole_ok[e] = False
    timed = list(error)
    runs = {e: {"whole": [], "segments": [[] for _ in inputs]} for e in timed}
    for _ in range(rounds + 2):  # the first two rounds warm up
        for e in timed:
            if whole_ok[e]:
                runs[e]["whole"] += _time(b.engine_stage([], 0, e, batch), x, 1)
            for i, xi in enumerate(inputs):
                runs[e]["segments"][i] += _time(b.engine_stage(cuts, i, e, batch), xi, 1)
    rows = []
    for e in timed:
        whole = statistics.median(runs[e]["whole"][2:]) if whole_ok[e] else float("nan")
        segments = [statistics.median(s[2:]) for s in runs[e]["segments"]]
        rows.append({"model": b.name, "batch": batch, "engine": e, "whole_ms": whole * 1e3,
                     "segments_ms": sum(segments) * 1e3, "largest_segment_ms": max(segments) * 1e3,
                     "max_rel_error": error[e]})
    base = next(r for r in rows if r["engine"] == engines.TORCH)
    for r in rows:
        r["speedup"] = base["whole_ms"] / r["whole_ms"]
        r["segments_speedup"] = base["segments_ms"] / r["segments_ms"]
    return rows


def _checked(b: StageBuilder, cuts: list[str], index: int, engine: str, batch: int) -> float:
    """Stage ``index`` exported and checked under ``engine``: its error against torch (torch: 0)."""
    b.engine_stage(cuts, index, engine, batch)
    check = b.engine_checks.get((tuple(cuts), index, engine, batch))
    return check.max_rel_error if check else 0.0


def every_classifier(engine: str, max_params: float | None = None, only: list[str] | None = None) -> None:
    """Every block split of every torchvision classifier (of at most ``max_params`` parameters)
    under ``engine``: the largest error of the split's two stages against the unsplit model, and the
    stages that do not export; ``only``: those classifiers alone. Each split's exports are dropped
    after it (a large model's would fill the disk)."""
    from torchvision import models as tv

    worst, refused, skipped = 0.0, [], []
    for name in only or sorted(tv.list_models(module=tv)):
        params = list(tv.get_model_weights(name))[0].meta.get("num_params", 0)
        if max_params is not None and params > max_params:
            skipped.append(f"{name} ({params / 1e6:.0f}M)")
            continue
        began = time.perf_counter()
        try:
            b = StageBuilder(name)
        except Exception as exc:  # a classifier the zoo does not partition
            print(f"{name}: not split here ({str(exc).splitlines()[0][:100]})", flush=True)
            continue
        x = b.example_batch(1)
        with torch.no_grad():
            want = live_tensors(b.model(x))
        model_worst, worst_k = 0.0, None
        for k in range(1, b.partitioner.num_blocks):
            try:
                error = onnxstage.max_rel_error(_split_outputs(b, k, engine, x), want)
                if error > model_worst:
                    model_worst, worst_k = error, k
            except onnxstage.EngineExportError as exc:
                refused.append(f"{name} k={k}: {exc}")
        worst = max(worst, model_worst)
        floor = _against_float64(b, x, want, engine, worst_k) if model_worst > BOUND else ""
        print(f"{name}: {b.partitioner.num_blocks - 1} block splits, largest error {model_worst:.2e}{floor} "
              f"({time.perf_counter() - began:.0f} s)", flush=True)
    print(f"every classifier under {engine}: largest error {worst:.2e} (bound {BOUND:g})")
    print("stages that do not export:" if refused else "every stage exported")
    for line in refused:
        print(f"  {line}")
    if skipped:
        print(f"not checked (over --max-params): {', '.join(skipped)}")


def _split_outputs(b: StageBuilder, k: int, engine: str, x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of block split ``k``'s two stages under ``engine``; its exports are dropped after
    (a large model's would fill the disk)."""
    cuts = [b.partitioner.block_cut(k)]
    try:
        return live_tensors(call_stage(b.engine_stage(cuts, 1, engine, 1), b.engine_stage(cuts, 0, engine, 1)(x)))
    finally:
        b._engine_stages.clear()
        for path in _exports_folder().glob("*.onnx"):
            path.unlink()


def _against_float64(b: StageBuilder, x: torch.Tensor, want: list[torch.Tensor], engine: str, k: int) -> str:
    """Both float32 results against the model in float64, on the same scale: the unsplit torch
    model's, and the engine's at its worst split ``k``. Where the two are alike, the engine's
    distance from torch is float32's own rounding, which no float32 engine can be read below (a
    deep random-weight ResNet's float32 logits are 1e-4 of their scale off exact arithmetic)."""
    with torch.no_grad():
        exact = live_tensors(b.model.double()(x.double()))
    b.model.float()
    engine_error = onnxstage.max_rel_error(_split_outputs(b, k, engine, x), exact)
    return (f"; against float64: torch float32 {onnxstage.max_rel_error(want, exact):.2e}, "
            f"{engine} at k={k} {engine_error:.2e}")


def _exports_folder():
    from paretopipe.partition import weightcache

    root = weightcache.cache_dir()
    return root / "engines" if root is not None else onnxstage._scratch()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--classifiers", action="store_true", help="check every torchvision classifier instead")
    ap.add_argument("--max-params", type=float, default=None, help="with --classifiers: only those of at most this "
                    "many parameters (e.g. 30e6)")
    ap.add_argument("--only", default=None, help="with --classifiers: these classifiers alone (comma list)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    if args.classifiers:
        every_classifier(engines.ONNXRUNTIME, args.max_params, args.only.split(",") if args.only else None)
        return
    print(f"engines: {', '.join(f'{e} {engines.version(e)}' for e in ENGINES)}; one thread, core 0")
    print(f"{'model':<32}{'batch':>6}  {'engine':<12}{'whole ms':>10}{'x torch':>9}{'segments ms':>13}"
          f"{'x torch':>9}{'max rel err':>13}")
    for name in args.models.split(","):
        for batch in (int(v) for v in args.batch_sizes.split(",")):
            for r in whole_and_segments(name, batch, args.rounds):
                print(f"{r['model']:<32}{r['batch']:>6}  {r['engine']:<12}{r['whole_ms']:>10.2f}{r['speedup']:>8.2f}x"
                      f"{r['segments_ms']:>13.2f}{r['segments_speedup']:>8.2f}x{r['max_rel_error']:>13.1e}",
                      flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
