"""What a TCP run leaves: its outcome, and the run record assembled from the two stages' parts
and written atomically (also when the run failed, with the batches that completed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from ... import records
from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink
from .. import inputs
from ..runconfig import RunConfig
from .messages import safe_run_id


@dataclasses.dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    outputs: list[torch.Tensor] | None = None


def link_manifest_of(conditions: NetworkConditions | None, emulated: bool, observed: dict | None,
                     link: EmulatedLink | None = None) -> dict[str, Any]:
    if observed is not None:
        return observed
    if conditions is not None and emulated:
        out = {"mode": "emulated", "conditions": conditions.to_dict(),
               "note": "in-process emulation at each sender (serialisation at rate, FIFO, then delay): "
                       "up shapes stage 1's frames, down the results"}
        if link is not None and link.trace is not None:
            out["trace_up"] = link.manifest()["trace"]  # where the replay started: reruns with the seed agree
        return out
    return {"mode": "none", "note": "no shaping by this run; the link is whatever the network is"}


def cipher_usage(connection: Any, before: dict[str, Any] | None) -> dict[str, Any]:
    """This stage's part of a run's encryption: the cipher, and the frames it sealed and opened
    in the run with the seconds they took (``{"cipher": "none"}`` on a plain connection)."""
    channel = connection.channel
    return channel.usage(before) if channel is not None else {"cipher": "none"}


def merge_peer_seals(batches: list[dict[str, Any]], peer_batches: Any) -> None:
    """Stage 2 seals a result after the result's own meta is written, so its seal times come back
    with its RECORDS; they join stage 1's batch records by sequence number."""
    if not peer_batches:
        return
    by_seq = {b["seq"]: b for b in batches}
    for pb in peer_batches:
        seal = pb.get("stage2_seal_s")
        if pb["seq"] in by_seq and isinstance(seal, (int, float)) and not isinstance(seal, bool) and 0 <= seal < 1e6:
            by_seq[pb["seq"]]["stage2_seal_s"] = float(seal)


def write_record(record: dict[str, Any], output_dir: str | Path | None) -> Path | None:
    if output_dir is None:
        return None
    return records.atomic_write_json(Path(output_dir) / f"{safe_run_id(record['run_id'])}.json", record)


def assemble_record(run_id: str, status: str, error: str | None, cfg: RunConfig,
                    part1: dict[str, Any] | None, part2: dict[str, Any] | None, link: dict[str, Any],
                    timing: dict[str, Any]) -> dict[str, Any]:
    """Merge the two stages' parts. Stage 1's batch records already carry stage 2's durations."""
    batches = (part1 or {}).get("batches") or (part2 or {}).get("batches") or []
    stages = [p["manifest"] for p in (part1, part2) if p]
    sysmon = {f"stage{i}": p["sysmon"] for i, p in ((1, part1), (2, part2)) if p}
    resources = {f"stage{i}": p["resources"] for i, p in ((1, part1), (2, part2)) if p and p.get("resources")}
    return records.build_run_record(backend="tcp", run_id=run_id, status=status, error=error,
                                    config=cfg.to_dict(),
                                    manifest={"stages": stages, "link": link,
                                              "inputs": inputs.describe(cfg.dataset, cfg.data_dir)},
                                    batches=batches, sysmon=sysmon, timing=timing, resources=resources)
