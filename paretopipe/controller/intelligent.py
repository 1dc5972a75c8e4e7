"""The anchor's ``--use-intelligent-splitting``: choose the split from device profiles through the
cost model, before the run, and keep the prediction beside what the run then measures.

The anchor's flag was accepted and the split stayed K//2. Here the choice is the block split with
the lowest modelled latency (:func:`paretopipe.predict.predictions.predict_splits`) under the run's
network conditions, from ``--device-profiles`` (one per stage) or, without them, from a quick
self-profile of this process's model (block segments timed here), which then stands for every
stage: true when the stages share this machine, a first guess otherwise, and recorded as such.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

from ..errors import UsageError
from ..network.conditions import NetworkConditions
from ..predict.adaptive_policy import self_profile
from ..predict.costmodel import LinkModel
from ..predict.device_profile import RESULT_CODEC, DeviceProfile, check_compatible
from ..predict.predictions import predict_splits
from ..transport.runconfig import RunConfig

log = logging.getLogger("paretopipe.intelligent")


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def choose_split(builder, batch_size: int, conditions: NetworkConditions | None,
                 device_profiles: Sequence[str] | None = None, seed: int = 0) -> tuple[int, dict[str, Any]]:
    """(block split k, the manifest's ``split_choice``: source, every candidate's prediction)."""
    # lazy for start-up: torch
    from ..transport import tcp
    part = builder.partitioner
    if device_profiles:
        if len(device_profiles) != 2:
            raise UsageError(f"--device-profiles: give two profiles (stage 1's, stage 2's) for "
                             f"--use-intelligent-splitting, got {len(device_profiles)}")
        profiles = [DeviceProfile.load(p) for p in device_profiles]
        for warning in check_compatible(profiles, builder.name):
            log.warning("intelligent splitting: %s", warning)
        source = {"profiles": list(device_profiles)}
    else:
        cfg = RunConfig(model=builder.name, cuts=[part.block_cut(0)], batch_size=batch_size, seed=seed)
        timings = tcp.self_profile_timings(builder, cfg)
        per_image = [part.payload_nbytes(c, 1) for c in part.block_cuts()]
        profiles = [self_profile(builder.name, batch_size, timings, per_image, role) for role in ("stage1", "stage2")]
        source = {"self_profile": "block segments timed in this process, standing for every stage",
                  "whole_model_s": timings.get("whole_model_s")}
    up, down = LinkModel.pair(conditions) if conditions is not None else (LinkModel(), LinkModel())
    table = predict_splits(profiles, up, batch_size, RESULT_CODEC, back=down)
    best = table.loc[table["predicted_latency_s"].idxmin()]
    k = int(best["split"])
    predicted = [{"split": int(r["split"]), "predicted_latency_s": _finite(r["predicted_latency_s"]),
                  "predicted_throughput_imgs_per_s": _finite(r["predicted_throughput_imgs_per_s"])}
                 for _, r in table.iterrows()]
    log.info("intelligent splitting chose k=%d (predicted latency %.4g s)", k, best["predicted_latency_s"])
    return k, {"policy": "intelligent", "objective": "latency", "chosen_split": k,
               "network": conditions.name if conditions is not None else None, **source, "predicted": predicted}
