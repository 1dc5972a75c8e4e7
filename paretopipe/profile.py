"""Per-device profiles: each segment's compute time between consecutive fine cuts, with
activation bytes, FLOPs and codec costs; measured once per device, read by the cost model.

A model with n fine cuts has n + 2 boundaries (``input``, the cuts, ``output``) and n + 1
segments, segment i running from boundary i to boundary i + 1. Any split's stage time is a sum
of consecutive segments, so one profile answers every split (and every multi-device plan).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from . import cpushare, data, hopprobe, records, split, wire
from .backends.common import StageBuilder, StageTimer
from .errors import UsageError

log = logging.getLogger("paretopipe.profile")

SCHEMA = "paretopipe.profile/1"
DEFAULT_CODECS = ("float32/none", "float16/none", "float32/zstd", "float32/lz4")
RESULT_CODEC = "float32/none"  # stage 2 always returns its result uncompressed in float32


@dataclasses.dataclass
class ProfileOptions:
    model: str
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1])
    device: str = "cpu"
    threads: int | None = None
    cpus: str | None = None
    cpu_share: float | None = None
    warmup: int = 3
    repetitions: int = 15
    codecs: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_CODECS))
    codec_repetitions: int = 3
    hop_probe: bool = True
    num_classes: int = 10
    weights: str | None = None
    models_dir: str | None = None


def parse_codec(text: str) -> wire.Codec:
    """``float16/zstd`` -> Codec(wire_dtype=float16, compression=zstd)."""
    dtype, _, comp = text.partition("/")
    return wire.Codec(compression=comp or "none", wire_dtype=dtype)


def codec_key(wire_dtype: str, compression: str) -> str:
    return f"{wire_dtype}/{compression}"


def _median_or_mean(xs: Sequence[float], mean: bool) -> float:
    return float(statistics.fmean(xs) if mean else statistics.median(xs))


def _round_trip(tensor: torch.Tensor, codec: wire.Codec, reps: int) -> dict[str, float]:
    """Encode, send over a real loopback TCP connection, receive and decode, ``reps`` times."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    enc_s, dec_s, transfer_s, frame_bytes, wire_bytes = [], [], [], 0, 0
    try:
        for _ in range(reps):
            enc = wire.encode(wire.TENSOR, 0, tensor, codec=codec)
            started = [0.0]

            def send(e: wire.Encoded = enc) -> None:
                started[0] = time.perf_counter()
                wire.send_encoded(client, e)

            sender = threading.Thread(target=send)
            sender.start()
            f = wire.recv_frame(server)
            done = time.perf_counter()
            sender.join()
            enc_s.append(enc.encode_s)
            dec_s.append(f.decode_s)
            transfer_s.append(done - started[0] - f.decode_s)
            frame_bytes, wire_bytes = enc.total_nbytes, enc.wire_nbytes
    finally:
        client.close()
        server.close()
    return {"encode_s": float(np.median(enc_s)), "decode_s": float(np.median(dec_s)),
            "loopback_transfer_s": float(np.median(transfer_s)), "frame_bytes": frame_bytes,
            "wire_bytes": wire_bytes}


def _fit_transport(points: list[tuple[int, float]]) -> dict[str, Any]:
    """transfer = fixed + bytes / bytes_per_s: ``fixed`` from the small frames (a least-squares
    intercept through megabyte frames is all noise), the rate from the rest."""
    small = [t for n, t in points if n <= 16384]
    fixed = float(np.median(small)) if small else 0.0
    large = [(n, t - fixed) for n, t in points if n > 16384]
    rate = None
    if large:
        xs = np.array([n for n, _ in large], dtype=float)
        ys = np.array([t for _, t in large], dtype=float)
        slope = float(np.dot(xs, ys) / np.dot(xs, xs))  # through the origin: fixed is already out
        rate = 1.0 / slope if slope > 0 else None
    return {"fixed_s": fixed, "bytes_per_s": rate,
            "note": "one frame between two threads over TCP loopback on this host, as fixed + bytes / "
                    "bytes_per_s; the cost model's transport beneath unshaped links of co-located stages"}


def measure(opts: ProfileOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Profile ``opts.model`` on this device; returns the profile document (see docs/predict.md)."""
    from .worker import apply_cpu_limits

    if not opts.batch_sizes or min(opts.batch_sizes) < 1:
        raise UsageError(f"--batch-sizes must be positive integers, got {opts.batch_sizes}")
    if opts.repetitions < 1 or opts.warmup < 0:
        raise UsageError("--repetitions must be at least 1 and --warmup 0 or more")
    codecs = {c: parse_codec(c) for c in dict.fromkeys([RESULT_CODEC, *opts.codecs])}
    limits = apply_cpu_limits(opts.cpus, opts.threads)
    builder = StageBuilder(opts.model, opts.num_classes, opts.weights, opts.models_dir, opts.device)
    part = builder.partitioner
    boundaries = [split.INPUT] + [c.name for c in part.cuts] + [split.OUTPUT]
    stages = [s.to(builder.device) for s in part.stages([c.name for c in part.cuts])]
    model = builder.model.to(builder.device)
    timer = StageTimer(builder.device)
    flops = [c.flops_before for c in part.cuts]
    seg_flops = np.diff([0] + flops + [part.total_flops]) // part.batch
    doc: dict[str, Any] = {
        "schema": SCHEMA, "created_utc": records.utc_now(), "model": builder.name,
        "fingerprint": builder.fingerprint, "num_classes": opts.num_classes, "input_size": builder.input_size,
        "device": builder.device,
        "boundaries": [{"index": i, "name": name,
                        "bytes_per_image": part.payload_nbytes(name, 1)} for i, name in enumerate(boundaries)],
        "segments": [{"index": i, "start": boundaries[i], "end": boundaries[i + 1],
                      "flops_per_image": int(seg_flops[i])} for i in range(len(boundaries) - 1)],
        "blocks": {str(k): boundaries.index(part.block_cut(k)) for k in range(part.num_blocks + 1)},
        "total_flops_per_image": int(part.total_flops // part.batch),
        "by_batch": {},
    }
    share_mean = opts.cpu_share is not None
    # Before any CPU share: the echo process stands for the other stage and must not inherit it.
    hop_s = hopprobe.hop_fixed_s() if opts.hop_probe else None
    with cpushare.limited(opts.cpu_share, "profile") as applied:
        limits.update(applied)
        for b in opts.batch_sizes:
            if progress:
                progress(f"batch {b}: timing {len(stages)} segments x {opts.repetitions}")
            doc["by_batch"][str(b)] = _measure_batch(b, builder, model, stages, timer, codecs, opts, share_mean)
    transport = [(e["frame_bytes"], e["loopback_transfer_s"]) for per in doc["by_batch"].values()
                 for e in per["codecs"][RESULT_CODEC]]
    doc["loopback"] = _fit_transport(transport)
    if hop_s is not None:
        doc["loopback"].update(fixed_s=hop_s, fixed_source="hopprobe: half the round trip of a tiny frame "
                               "through two processes' sender, receiver and compute threads")
    doc["method"] = {"warmup": opts.warmup, "repetitions": opts.repetitions,
                     "statistic": "mean" if share_mean else "median",
                     "why_statistic": "under a CPU quota single calls are either full speed or frozen, so only "
                                      "the mean adds up across segments" if share_mean else
                                      "median of repetitions after warm-up",
                     "timer": "CUDA-synchronised wall clock and events" if builder.device.startswith("cuda")
                     else "perf_counter", "codec_repetitions": opts.codec_repetitions}
    doc["manifest"] = records.node_manifest(builder.device, limits.get("torch_threads"), role="profile",
                                            weights_fingerprint=builder.fingerprint, limits=limits)
    return doc


def _measure_batch(b: int, builder: StageBuilder, model: nn.Module, stages: list[nn.Module],
                   timer: StageTimer, codecs: dict[str, wire.Codec], opts: ProfileOptions,
                   mean: bool) -> dict[str, Any]:
    device = builder.device
    x = data.synthetic_batch(0, b, builder.input_size).to(device)

    def chain(keep: bool = False) -> tuple[list[float], list[torch.Tensor]]:
        times, outs, y = [], [x], x
        for stage in stages:
            y, t = timer.run(stage, y, device)
            times.append(t)
            if keep:
                outs.append(y)
        return times, outs

    for _ in range(opts.warmup):
        chain()
        timer.run(model, x, device)
    seg_runs, whole_runs = [], []
    for _ in range(opts.repetitions):  # interleaved, so drift hits both alike
        seg_runs.append(chain()[0])
        whole_runs.append(timer.run(model, x, device)[1])
    source = []
    for i in range(max(5, opts.repetitions)):
        t0 = time.perf_counter()
        data.synthetic_batch(i, b, builder.input_size)
        source.append(time.perf_counter() - t0)
    _, tensors = chain(keep=True)
    codec_rows: dict[str, list[dict[str, Any]]] = {}
    for key, codec in codecs.items():
        codec_rows[key] = [_round_trip(t.detach().cpu(), codec, opts.codec_repetitions) for t in tensors]
    segments = [_median_or_mean([r[i] for r in seg_runs], mean) for i in range(len(stages))]
    whole = _median_or_mean(whole_runs, mean)
    # What calling a stage costs beyond its work: chained segments pay it once each, a stage once.
    overhead = max(0.0, (sum(segments) - whole) / max(1, len(segments) - 1))
    return {"segment_compute_s": segments, "whole_model_s": whole, "call_overhead_s": overhead,
            "source_s": float(statistics.median(source)),
            "codecs": codec_rows}


# -- reading profiles ----------------------------------------------------------------------------
class DeviceProfile:
    """A loaded profile with the lookups the cost model needs."""

    def __init__(self, doc: dict[str, Any], path: str | None = None) -> None:
        if doc.get("schema") != SCHEMA:
            raise UsageError(f"{path or 'profile'} is not a ParetoPipe profile (schema {doc.get('schema')!r}, "
                             f"expected {SCHEMA}); make one with python -m paretopipe.profile")
        self.doc, self.path = doc, path or "profile"
        self.model: str = doc["model"]
        self.boundaries: list[str] = [b["name"] for b in doc["boundaries"]]
        self.blocks: dict[int, int] = {int(k): v for k, v in doc["blocks"].items()}

    @classmethod
    def load(cls, path: str | Path) -> "DeviceProfile":
        import json

        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"profile not found: {path} (make it with python -m paretopipe.profile --model M "
                             f"--out {path})")
        except (OSError, ValueError) as exc:
            raise UsageError(f"profile {path} is not readable JSON: {exc}")
        if not isinstance(doc, dict):
            raise UsageError(f"profile {path} is not a JSON object")
        return cls(doc, str(path))

    @classmethod
    def load_spec(cls, spec: str) -> "DeviceProfile":
        """``a.json`` or ``a.json+b.json``: profiles of one device taken at different times (for
        example before and after a long sweep) are averaged, which halves the effect of the
        machine's speed drifting in between."""
        parts = [p.strip() for p in spec.split("+") if p.strip()]
        if len(parts) == 1:
            return cls.load(parts[0])
        return average([cls.load(p) for p in parts])

    @property
    def name(self) -> str:
        return Path(self.path.split("+")[0]).stem

    @property
    def torch_version(self) -> str | None:
        return self.doc.get("manifest", {}).get("torch")

    @property
    def limits(self) -> dict[str, Any]:
        return self.doc.get("manifest", {}).get("limits", {})

    def batch(self, b: int) -> dict[str, Any]:
        try:
            return self.doc["by_batch"][str(b)]
        except KeyError:
            have = ", ".join(sorted(self.doc["by_batch"], key=int))
            raise UsageError(f"{self.path} has no timings at batch size {b} (it has {have}); profile again "
                             f"with --batch-sizes {b}")

    def stage_compute_s(self, b: int, start: int, stop: int) -> float:
        """Compute of boundaries start..stop (segments start..stop-1) as ONE stage call."""
        if stop <= start:
            return 0.0
        per = self.batch(b)
        segs = per["segment_compute_s"][start:stop]
        return max(0.0, sum(segs) - (len(segs) - 1) * per.get("call_overhead_s", 0.0))

    def codec(self, b: int, boundary: int, key: str) -> dict[str, Any]:
        rows = self.batch(b)["codecs"]
        if key not in rows:
            raise UsageError(f"{self.path} has no {key} codec timings (it has {', '.join(rows)}); profile "
                             f"again with --codecs {key}")
        return rows[key][boundary]

    def source_s(self, b: int) -> float:
        return self.batch(b)["source_s"]


def average(profiles: Sequence[DeviceProfile]) -> DeviceProfile:
    """One profile whose timings are the means of ``profiles`` (same model, cuts and batch sizes)."""
    import copy

    first = profiles[0]
    for p in profiles[1:]:
        if p.model != first.model or p.boundaries != first.boundaries or set(p.doc["by_batch"]) != set(first.doc["by_batch"]):
            raise UsageError(f"cannot average {p.path} with {first.path}: they profile different models, cuts "
                             f"or batch sizes")
    doc = copy.deepcopy(first.doc)

    def mean(values: list) -> Any:
        if isinstance(values[0], list):
            return [mean(list(v)) for v in zip(*values)]
        if isinstance(values[0], dict):
            return {k: mean([v[k] for v in values]) if isinstance(values[0][k], (float, list, dict))
                    else values[0][k] for k in values[0]}
        return float(statistics.fmean(values))

    for b in doc["by_batch"]:
        doc["by_batch"][b] = mean([p.doc["by_batch"][b] for p in profiles])
    doc["loopback"] = mean([p.doc["loopback"] for p in profiles])
    doc["averaged_from"] = [p.path for p in profiles]
    return DeviceProfile(doc, "+".join(p.path for p in profiles))


def check_compatible(profiles: Sequence[DeviceProfile], model: str | None = None) -> list[str]:
    """Refuse profiles of another model (or of different cut lists); return warnings for softer
    differences (torch version, weights), which change timings but not the structure."""
    from . import models

    wanted = models.canonical_name(model) if model else profiles[0].model
    for p in profiles:
        if p.model != wanted:
            raise UsageError(f"{p.path} profiles {p.model}, not {wanted}: profile each device with "
                             f"python -m paretopipe.profile --model {wanted}")
        if p.boundaries != profiles[0].boundaries:
            raise UsageError(f"{p.path} and {profiles[0].path} disagree on the cut points of {wanted} "
                             f"(different torch/torchvision graphs); profile both with the same versions")
    warnings = []
    versions = {p.torch_version for p in profiles}
    local = torch.__version__
    for p in profiles:
        if p.torch_version != local:
            warnings.append(f"{p.path} was measured with torch {p.torch_version}, this is torch {local}: "
                            f"timings may not carry over")
    if len(versions) > 1:
        warnings.append(f"the profiles come from different torch versions ({', '.join(sorted(map(str, versions)))})")
    return warnings


# -- command line --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    from .cli import HelpFormatter, add_common_flags, example_epilog, setup_logging

    p = argparse.ArgumentParser(
        prog="python -m paretopipe.profile", formatter_class=HelpFormatter,
        description="Profile a model on this device: compute time of every segment between fine cuts, "
                    "activation bytes, FLOPs and codec costs. Run once per device; feed the files to "
                    "python -m paretopipe.predict.",
        epilog=example_epilog(
            "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --out profiles/server-mobilenet_v2.json",
            "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --cpu-share 0.25 "
            "--out profiles/edge-mobilenet_v2.json   # an emulated weaker device",
            "python -m paretopipe.profile --model resnet50 --device cuda --batch-sizes 1,8 --out profiles/gpu-resnet50.json"))
    p.add_argument("--model", required=True, help="zoo name, e.g. mobilenetv2, resnet18")
    p.add_argument("--batch-sizes", default="1", help="comma list of batch sizes to time")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None, help="torch threads (match the stage that will run here)")
    p.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0 or 0-3 (as the sweeper pins stages)")
    p.add_argument("--cpu-share", type=float, default=None,
                   help="hold this process to a CPU share via cgroups (emulates a weaker device; as --stage-cpu)")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    p.add_argument("--repetitions", type=int, default=15, help="timed passes; the median (mean under a share) is kept")
    p.add_argument("--codecs", default=",".join(DEFAULT_CODECS),
                   help="wire-dtype/compression pairs to time on every cut (float32/none is always timed)")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--weights", default=None)
    p.add_argument("--out", required=True, help="profile JSON to write, e.g. profiles/<device>-<model>.json")
    add_common_flags(p)
    args = p.parse_args(argv)
    setup_logging(args.debug, args.quiet)
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: give a comma list of integers like 1,8")
    if args.cpu_share is not None:
        cpushare.check_share(args.cpu_share)
    opts = ProfileOptions(model=args.model, batch_sizes=sizes, device=args.device, threads=args.threads,
                          cpus=args.cpus, cpu_share=args.cpu_share, warmup=args.warmup,
                          repetitions=args.repetitions,
                          codecs=[c.strip() for c in args.codecs.split(",") if c.strip()],
                          num_classes=args.num_classes, weights=args.weights)
    doc = measure(opts, progress=log.info)
    path = records.atomic_write_json(args.out, doc)
    for b, per in doc["by_batch"].items():
        total = sum(per["segment_compute_s"])
        print(f"batch {b}: {len(per['segment_compute_s'])} segments sum to {total * 1e3:.2f} ms; the whole model "
              f"takes {per['whole_model_s'] * 1e3:.2f} ms (ratio {total / per['whole_model_s']:.3f})")
    print(f"profile written: {path}")
    return 0


if __name__ == "__main__":
    from .cli import run_cli

    raise SystemExit(run_cli(main))
