"""Synthetic device profiles with hand-chosen numbers, for exact cost-model and planner tests."""

from __future__ import annotations

from typing import Sequence

from paretopipe.profile import RESULT_CODEC, SCHEMA, DeviceProfile


def synthetic_profile(segments_s: Sequence[float], bytes_per_image: Sequence[int], *, source_s: float = 0.0,
                      encode_s: float = 0.0, decode_s: float = 0.0, frame_overhead: int = 0,
                      blocks: dict[int, int] | None = None, model: str = "mobilenet_v2",
                      torch_version: str | None = None, call_overhead_s: float = 0.0,
                      host: str = "testhost") -> DeviceProfile:
    """A profile of len(segments_s) segments; bytes_per_image has one entry per boundary."""
    import torch

    assert len(bytes_per_image) == len(segments_s) + 1
    names = ["input"] + [f"cut{i}" for i in range(1, len(segments_s))] + ["output"]
    rows = [{"encode_s": encode_s, "decode_s": decode_s, "frame_bytes": n + frame_overhead, "wire_bytes": n,
             "loopback_transfer_s": 0.0} for n in bytes_per_image]
    doc = {"schema": SCHEMA, "model": model,
           "boundaries": [{"index": i, "name": n, "bytes_per_image": b}
                          for i, (n, b) in enumerate(zip(names, bytes_per_image))],
           "blocks": {str(k): v for k, v in (blocks or {i: i for i in range(len(names))}).items()},
           "by_batch": {"1": {"segment_compute_s": list(segments_s), "whole_model_s": sum(segments_s),
                              "source_s": source_s, "call_overhead_s": call_overhead_s,
                              "codecs": {RESULT_CODEC: rows}}},
           "loopback": {"fixed_s": 0.0, "bytes_per_s": None},
           "manifest": {"torch": torch_version or torch.__version__, "torch_threads": 1, "hostname": host,
                        "limits": {}}}
    return DeviceProfile(doc, f"{model}-synthetic.json")
