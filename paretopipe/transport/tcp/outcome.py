"""What a TCP run leaves: its outcome, and the run record assembled from the stages' parts and
written atomically (also when the run failed, with the batches that completed)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ... import records
from ...errors import WireError
from ...network.conditions import NetworkConditions
from ...network.emulated import EmulatedLink
from .. import inputs
from ..runconfig import RunConfig
from .messages import check_part, safe_run_id

_SEAL = re.compile(r"^stage\d+_seal_s$")


@dataclasses.dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    outputs: list[torch.Tensor] | None = None
    connection: Any = None  # stage 1's connection still open after the run (a guarded run's may be a new one)


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


def merge_peer_seals(parts: Sequence[dict[str, Any] | None]) -> None:
    """A later stage seals a result after the result's own meta is written, so its seal times
    (``stageN_seal_s``) come back with its RECORDS; they join stage 1's batch records (the first
    of ``parts``, in stage order) by sequence number. Without stage 1's part there is nothing to join."""
    if not parts or parts[0] is None:
        return
    by_seq = {b["seq"]: b for b in parts[0]["batches"]}
    for pb in (b for part in parts[1:] for b in (part or {}).get("batches") or []):
        for key, seal in pb.items():
            if (_SEAL.match(key) and pb["seq"] in by_seq and isinstance(seal, (int, float))
                    and not isinstance(seal, bool) and 0 <= seal < 1e6):
                by_seq[pb["seq"]][key] = float(seal)


def later_parts(back: dict[str, Any], who: int, stages: int) -> list[dict[str, Any]]:
    """The parts stage ``who`` (numbered from 1) of ``stages`` sent back: its own, then one for
    each stage after it (``later``), each checked against the part schema."""
    later = back.get("later") or []
    if not isinstance(later, list) or len(later) != stages - who:
        raise WireError(f"stage {who}'s RECORDS carry {len(later) if isinstance(later, list) else 'no list of'} "
                        f"later parts; stages {who + 1}..{stages} make {stages - who}")
    return [back] + [check_part(p, f"stage {who + 1 + i}", False) for i, p in enumerate(later)]


def write_record(record: dict[str, Any], output_dir: str | Path | None) -> Path | None:
    if output_dir is None:
        return None
    return records.write_run_json(Path(output_dir) / f"{safe_run_id(record['run_id'])}.json", record)



def assemble_record(run_id: str, status: str, error: str | None, cfg: RunConfig,
                    parts: Sequence[dict[str, Any] | None], link: dict[str, Any],
                    timing: dict[str, Any], finish: Callable[[dict[str, Any], Sequence[dict[str, Any] | None]], None],
                    loadgen: Any = None) -> dict[str, Any]:
    """Merge the stages' parts, in stage order (a missing one is None). Stage 1's batch records
    already carry the later stages' durations; without stage 1's part, the last stage's batches.
    ``finish``: the writing stage's endpoint adds its workload's figures (a generation's tokens).
    ``loadgen``: the harness of a LoadGen run at stage 1, whose part and figures join the record."""
    batches = next((p.get("batches") for p in parts if p and p.get("batches")), None) or []
    stages = [p["manifest"] for p in parts if p]
    numbered = list(enumerate(parts, start=1))
    sysmon = {f"stage{i}": p["sysmon"] for i, p in numbered if p}
    resources = {f"stage{i}": p["resources"] for i, p in numbered if p and p.get("resources")}
    record = records.build_run_record(backend="tcp", run_id=run_id, status=status, error=error,
                                      config=cfg.to_dict(),
                                      manifest={"stages": stages, "link": link,
                                                "inputs": inputs.describe(cfg.dataset, cfg.data_dir)},
                                      batches=batches, sysmon=sysmon, timing=timing, resources=resources,
                                      loadgen=loadgen)
    for part in parts:  # stage 1's evaluation pass (transport.fidelity) and a fault's figures (faults)
        for extra in ("fidelity", "fault"):
            if part and part.get(extra):
                record["summary"].update(part[extra])
    finish(record, parts)
    return record
