"""Measuring a device profile: each segment's compute time between consecutive fine cuts, with
activation bytes, FLOPs and codec costs; measured once per device, read by the cost model
(:mod:`paretopipe.predict.device_profile`).

A model with n fine cuts has n + 2 boundaries (``input``, the cuts, ``output``) and n + 1
segments, segment i running from boundary i to boundary i + 1. Any split's stage time is a sum
of consecutive segments, so one profile answers every split (and every multi-device plan).
The fine cuts are those of one live tensor, or with ``max_live`` N those of up to N (and the
block cuts, whatever they carry): a boundary's bytes are its whole live set's, and its codec
costs are one frame of that live set.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from .. import engines, records
from ..compute import cpushare
from ..errors import UsageError
from ..manifest import node_manifest
from ..partition import fxcuts, onnxstage, wirequant
from ..partition.activation import Activation, to_host
from ..partition.stages import StageBuilder, StageTimer, apply_cpu_limits
from ..transport import aead, inputs, wire
from ..partition.names import DEFAULT_NUM_CLASSES
from . import hopprobe
from .device_profile import DEFAULT_CODECS, RESULT_CODEC, SCHEMA

log = logging.getLogger("paretopipe.profile")



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
    ciphers: list[str] = dataclasses.field(default_factory=lambda: list(aead.CIPHERS))  # --encrypt's, timed per frame
    codec_repetitions: int = 3
    hop_probe: bool = True
    num_classes: int = DEFAULT_NUM_CLASSES
    weights: str | None = None
    models_dir: str | None = None
    dataset: str = "photos"
    data_dir: str | None = None
    max_live: int = 1  # boundaries: the cuts that at most this many tensors cross
    engine: str = engines.TORCH  # paretopipe.engines: another times ONNX exports of the segments and ranges


def parse_codec(text: str) -> wire.Codec:
    """``float16/zstd`` -> Codec(wire_dtype=float16, compression=zstd)."""
    dtype, _, comp = text.partition("/")
    return wire.Codec(compression=comp or "none", wire_dtype=dtype)


def _median_or_mean(xs: Sequence[float], mean: bool) -> float:
    return float(statistics.fmean(xs) if mean else statistics.median(xs))


def _round_trip(tensor: Activation, codec: wire.Codec, reps: int) -> dict[str, float]:
    """Encode, send over a real loopback TCP connection, receive and decode, ``reps`` times (int8
    and int4 quantised before the codec and dequantised after it, as a stage does)."""
    dtype = codec.wire_dtype
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    enc_s, dec_s, transfer_s, frame_bytes, wire_bytes = [], [], [], 0, 0
    try:
        for _ in range(reps):
            sent, quantise_s = wirequant.timed(wirequant.encode_activation, tensor, dtype)
            enc = wire.encode(wire.TENSOR, 0, sent, codec=codec)
            started = [0.0]

            def send(e: wire.Encoded = enc) -> None:
                started[0] = time.perf_counter()
                wire.send_encoded(client, e)

            sender = threading.Thread(target=send)
            sender.start()
            f = wire.recv_frame(server)
            done = time.perf_counter()
            _, dequantise_s = wirequant.timed(lambda: wirequant.decode_activation(wirequant.grouped(f.tensor, dtype),
                                                                                  dtype))
            sender.join()
            enc_s.append(enc.encode_s + quantise_s)
            dec_s.append(f.decode_s + dequantise_s)
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


def _structure(part: Any, cuts: list, boundaries: list[str], stages: list[nn.Module]) -> dict[str, Any]:
    """The profile's boundaries (live tensors and bytes), segments (FLOPs, parameters, activation
    peak) and block splits: what the model is, apart from any timing."""
    seg_flops = np.diff([0] + [c.flops_before for c in cuts] + [part.total_flops]) // part.batch
    return {
        "boundaries": [{"index": i, "name": name, "live": len(part.live_names(name)),
                        "bytes_per_image": part.payload_nbytes(name, 1)} for i, name in enumerate(boundaries)],
        "segments": [{"index": i, "start": boundaries[i], "end": boundaries[i + 1],
                      "flops_per_image": int(seg_flops[i]),
                      "param_bytes": sum(t.numel() * t.element_size()
                                         for t in (*stages[i].parameters(), *stages[i].buffers())),
                      "activation_peak_bytes_per_image": part.activation_peak_nbytes(boundaries[1:-1], i, 1)}
                     for i in range(len(boundaries) - 1)],
        "blocks": {str(k): boundaries.index(part.block_cut(k)) for k in range(part.num_blocks + 1)},
        "total_flops_per_image": int(part.total_flops // part.batch),
    }


def measure(opts: ProfileOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Profile ``opts.model`` on this device; returns the profile document (see docs/predict.md)."""
    if not opts.batch_sizes or min(opts.batch_sizes) < 1:
        raise UsageError(f"--batch-sizes must be positive integers, got {opts.batch_sizes}")
    if opts.repetitions < 1 or opts.warmup < 0:
        raise UsageError("--repetitions must be at least 1 and --warmup 0 or more")
    unknown = [c for c in opts.ciphers if c not in aead.CIPHERS]
    if unknown:  # before any timing, not after minutes of it
        raise UsageError(f"--ciphers {unknown[0]!r}: valid {', '.join(aead.CIPHERS)} (or none)")
    codecs = {c: parse_codec(c) for c in dict.fromkeys([RESULT_CODEC, *opts.codecs])}
    limits = apply_cpu_limits(opts.cpus, opts.threads)
    builder = StageBuilder(opts.model, opts.num_classes, opts.weights, opts.models_dir, opts.device)
    part = builder.partitioner
    wanted = {c.name for c in part.candidate_cuts(opts.max_live)} | {part.block_cut(k) for k in range(1, part.num_blocks)}
    cuts = [c for c in part.fine_cuts if c.name in wanted]
    boundaries = [fxcuts.INPUT] + [c.name for c in cuts] + [fxcuts.OUTPUT]
    stages = [s.to(builder.device) for s in part.stages([c.name for c in cuts])]
    model = builder.model.to(builder.device)
    timer = StageTimer(builder.device)
    doc: dict[str, Any] = {"schema": SCHEMA, "created_utc": records.utc_now(), "model": builder.name,
                           "fingerprint": builder.fingerprint, "num_classes": opts.num_classes,
                           "input_size": builder.input_size, "device": builder.device, "engine": {
                               "engine": opts.engine, "version": engines.version(opts.engine)},
                           **_structure(part, cuts, boundaries, stages), "by_batch": {}}
    share_mean = opts.cpu_share is not None
    # Before any CPU share: the echo process stands for the other stage and must not inherit it.
    hop_s = hopprobe.hop_fixed_s() if opts.hop_probe else None
    # An engine's exports are made (or found in the cache) at full speed, before any CPU share.
    prepared = _opened({b: (*_engine_stages(builder, boundaries, b, opts.engine, stages, model),
                            _range_stages(builder, boundaries, b, opts.engine)) for b in opts.batch_sizes})
    with cpushare.limited(opts.cpu_share, "profile") as applied:
        limits.update(applied)
        for b in opts.batch_sizes:
            if progress:
                progress(f"batch {b}: timing {len(stages)} segments x {opts.repetitions} under {opts.engine}")
            doc["by_batch"][str(b)] = _measure_batch(b, builder, prepared[b][1], prepared[b][0], timer, codecs,
                                                     opts, share_mean)
            if prepared[b][2]:
                doc["by_batch"][str(b)]["range_compute_s"] = _range_times(builder, prepared[b][2], len(boundaries) - 1,
                                                                          b, opts, timer, share_mean)
    transport = [(e["frame_bytes"], e["loopback_transfer_s"]) for per in doc["by_batch"].values()
                 for e in per["codecs"][RESULT_CODEC]]
    doc["loopback"] = _fit_transport(transport)
    if hop_s is not None:
        doc["loopback"].update(fixed_s=hop_s, fixed_source="hopprobe: half the round trip of a tiny frame "
                               "through two processes' sender, receiver and compute threads")
    with cpushare.limited(opts.cpu_share, "profile"):  # sealing runs on the stage's own share
        doc["ciphers"] = {c: aead.time_cipher(c) for c in opts.ciphers}
    doc["aes_instructions"] = aead.has_aes_instructions()
    doc["method"] = {"warmup": opts.warmup, "repetitions": opts.repetitions, "max_live": opts.max_live,
                     "statistic": "mean" if share_mean else "median",
                     "why_statistic": "under a CPU quota single calls are either full speed or frozen, so only "
                                      "the mean adds up across segments" if share_mean else
                                      "median of repetitions after warm-up",
                     "timer": "CUDA-synchronised wall clock and events" if builder.device.startswith("cuda")
                     else "perf_counter", "codec_repetitions": opts.codec_repetitions}
    doc["manifest"] = node_manifest(builder.device, limits.get("torch_threads"), role="profile",
                                    weights_fingerprint=builder.fingerprint, limits=limits)
    doc["inputs"] = inputs.describe(opts.dataset, opts.data_dir)
    return doc


Prepared = dict[int, tuple[list[nn.Module], nn.Module, dict[str, tuple[nn.Module, nn.Module]]]]


def _opened(prepared: Prepared) -> Prepared:
    """``prepared`` with every engine stage's session opened at full speed (a process-wide share
    holds its threads later all the same)."""
    for segments, whole, ranges in prepared.values():
        for module in (*segments, whole, *(m for pair in ranges.values() for m in pair)):
            if isinstance(module, onnxstage.EngineStage):
                module.open()
    return prepared


def _engine_stages(builder: StageBuilder, boundaries: list[str], b: int, engine: str, stages: list[nn.Module],
                   model: nn.Module) -> tuple[list[nn.Module], nn.Module]:
    """The segments and the whole model as ``engine`` runs them (torch: as they are)."""
    if engine == engines.TORCH:
        return stages, model
    interior = boundaries[1:-1]
    return ([builder.engine_stage(interior, i, engine, b) for i in range(len(interior) + 1)],
            builder.engine_stage([], 0, engine, b))


def _range_stages(builder: StageBuilder, boundaries: list[str], b: int, engine: str
                  ) -> dict[str, tuple[nn.Module, nn.Module]]:
    """Under an engine, each block split's two stages as one export each, keyed ``"j"`` by the
    cut's boundary index (none under torch, whose stages are the sums of their segments)."""
    if engine == engines.TORCH:
        return {}
    part = builder.partitioner
    return {str(boundaries.index(part.block_cut(k))): (builder.engine_stage([part.block_cut(k)], 0, engine, b),
                                                       builder.engine_stage([part.block_cut(k)], 1, engine, b))
            for k in range(1, part.num_blocks)}


def _range_times(builder: StageBuilder, ranges: dict[str, tuple[nn.Module, nn.Module]], last: int, b: int,
                 opts: ProfileOptions, timer: StageTimer, mean: bool) -> dict[str, float]:
    """Each block split's two stages timed as exports of their own (``"0:j"`` and ``"j:last"``, by
    boundary index): an engine fuses operators across segments, so a stage's time is not the sum of
    its segments'. What a two-stage split's cost model reads (DeviceProfile.stage_compute_s)."""
    x = next(inputs.batches(opts.dataset, b, builder.input_size, 1, opts.data_dir, seed=0, model=builder.name))
    out: dict[str, float] = {}
    for j, (first, rest) in ranges.items():
        y, _ = timer.run(first, x, builder.device)
        for _ in range(opts.warmup):
            timer.run(first, x, builder.device)
            timer.run(rest, y, builder.device)
        firsts, rests = [], []
        for _ in range(opts.repetitions):  # interleaved, as the segments are
            firsts.append(timer.run(first, x, builder.device)[1])
            rests.append(timer.run(rest, y, builder.device)[1])
        out[f"0:{j}"], out[f"{j}:{last}"] = _median_or_mean(firsts, mean), _median_or_mean(rests, mean)
    return out


def _measure_batch(b: int, builder: StageBuilder, model: nn.Module, stages: list[nn.Module],
                   timer: StageTimer, codecs: dict[str, wire.Codec], opts: ProfileOptions,
                   mean: bool) -> dict[str, Any]:
    device = builder.device
    def source_batch(i: int) -> torch.Tensor:
        return next(inputs.batches(opts.dataset, b, builder.input_size, 1, opts.data_dir, seed=i, model=builder.name))

    x = source_batch(0).to(device)

    def chain(keep: bool = False) -> tuple[list[float], list[Any]]:
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
        source_batch(i)
        source.append(time.perf_counter() - t0)
    _, tensors = chain(keep=True)
    codec_rows: dict[str, list[dict[str, Any]]] = {}
    for key, codec in codecs.items():
        codec_rows[key] = [_round_trip(to_host(t), codec, opts.codec_repetitions) for t in tensors]
    segments = [_median_or_mean([r[i] for r in seg_runs], mean) for i in range(len(stages))]
    whole = _median_or_mean(whole_runs, mean)
    # What calling a stage costs beyond its work: chained segments pay it once each, a stage once.
    overhead = max(0.0, (sum(segments) - whole) / max(1, len(segments) - 1))
    return {"segment_compute_s": segments, "whole_model_s": whole, "call_overhead_s": overhead,
            "source_s": float(statistics.median(source)),
            "codecs": codec_rows}
