"""The TCP backend's messages: the handshake's and a run's typed frames, checked field by field
before anything uses them, and the one way a frame carries JSON."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
from typing import Any

import torch

# jsonschema imports every optional format library installed beside it, and one that Jupyter's
# extras bring (rfc3987_syntax) compiles a grammar at import: 1.6 s of CPU in every stage process.
# These schemas check no formats, so that one is kept out while jsonschema loads.
_HIDE = "rfc3987_syntax" not in sys.modules
if _HIDE:
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
try:
    import jsonschema
finally:
    if _HIDE:
        del sys.modules["rfc3987_syntax"]

from ... import records, strict
from ...errors import UsageError, WireError
from .. import wire

STAGE_RESULT_FIELDS = ("decode_s", "queue_s", "compute_s", "encode_s")


def result_meta_fields(stage: int) -> tuple[str, ...]:
    """The durations stage ``stage`` (numbered from 1) adds to a result's meta on its way back."""
    return tuple(f"stage{stage}_{f}" for f in STAGE_RESULT_FIELDS)


RESULT_META_FIELDS = result_meta_fields(2)
IDENTITY_FIELDS = ("model", "fingerprint", "num_classes", "wire_version")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")


@dataclasses.dataclass
class Challenge:
    nonce: str
    auth: bool
    encrypt: str = "none"  # stage 1's --encrypt, and whether its CPU has AES instructions
    aes: bool = False


@dataclasses.dataclass
class Hello:
    model: str
    fingerprint: str
    num_classes: int
    wire_version: int
    nonce: str
    cuts: list[str] | None = None
    mac: str | None = None
    encrypt: str = "none"  # stage 2's --encrypt, and whether its CPU has AES instructions
    aes: bool = False

    def identity(self) -> dict[str, Any]:
        """What stage 2's proof covers: its identity, and its cipher choice when it asks for one
        (so a downgrade on the way fails authentication)."""
        out = {k: getattr(self, k) for k in IDENTITY_FIELDS}
        if self.encrypt != "none":
            out.update(encrypt=self.encrypt, aes=self.aes)
        return out


@dataclasses.dataclass
class HelloOk:
    mac: str | None = None


@dataclasses.dataclass
class RunStart:
    run_id: str
    config: dict[str, Any]
    link: dict[str, Any]
    return_link: dict[str, Any] | None = None
    # In a chain of more than two stages: which stage receives this RUN (0-based; stage 1 is 0),
    # and the emulated direction its own forward frames take.
    stage: int = 1
    forward_link: dict[str, Any] | None = None


def message(cls: type, meta: dict[str, Any], what: str):
    try:
        return strict.from_dict(cls, meta, what)
    except UsageError as exc:
        raise WireError(str(exc))


def safe_run_id(run_id: Any) -> str:
    """A run id is a file name chosen by stage 1: letters, digits, ``._-``, never a path."""
    if not isinstance(run_id, str) or not _SAFE_NAME.match(run_id) or ".." in run_id:
        raise WireError(f"run id {str(run_id)[:80]!r} is not a safe file name ([A-Za-z0-9._-], no path)")
    return run_id


_COUNT = {"type": "integer", "minimum": 0}
_INTS = {"type": "array", "maxItems": 1_000_000, "items": _COUNT}
_PART_SCHEMA = {
    "type": "object", "required": ["manifest", "sysmon"],
    "properties": {
        "manifest": {"type": "object", "maxProperties": 64},
        "sysmon": {"type": "object", "maxProperties": 64,
                   "additionalProperties": {"type": ["number", "null", "string"]}},
        # A stage's energy and memory (transport.resources): nested objects of numbers, strings and
        # booleans; records.summarize reads only numbers from it.
        "resources": {"type": "object", "maxProperties": 16},
        # A generation's part (transport.generation): its blocks, KV cache and parameters; stage 1's
        # prompts and tokens; the last stage's exactness check.
        "generation": {"type": "object", "maxProperties": 16, "properties": {
            "blocks": _INTS, "layers": _INTS, "kv_bytes": _COUNT, "kv_tokens": _COUNT, "param_bytes": _COUNT,
            "weights_fingerprint": {"type": "string", "maxLength": 64},
            "prompt_tokens": _INTS, "tokens": {"type": "array", "maxItems": 4096, "items": _INTS},
            "sequences": {"type": "array", "maxItems": 4096, "items": _INTS},
            "exactness": {"type": "object", "maxProperties": 8, "properties": {
                "token_agreement": {"type": "number", "minimum": 0, "maximum": 1},
                "max_logit_diff": {"type": "number", "minimum": 0}, "steps": _COUNT,
                "reference": {"type": "string", "maxLength": 200}}}}},
        "batches": {"type": "array", "maxItems": 1_000_000, "items": {
            "type": "object", "required": ["seq", "warmup"], "maxProperties": 64,
            "properties": {"seq": {"type": "integer", "minimum": 0}, "warmup": {"type": "boolean"}},
            "additionalProperties": {"type": ["number", "boolean", "null", "array"]}}},
    },
}


@functools.lru_cache(maxsize=2)
def _part_validator(batches: bool) -> Any:
    """Built once: ``jsonschema.validate`` checks the schema itself on every call, 9 ms a run."""
    schema = dict(_PART_SCHEMA, required=["manifest", "sysmon"] + (["batches"] if batches else []))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_part(part: Any, who: str, batches: bool) -> dict[str, Any]:
    """A peer's RECORDS part, validated against its schema before anything uses it."""
    error = jsonschema.exceptions.best_match(_part_validator(batches).iter_errors(part))
    if error is not None:
        raise WireError(f"{who}'s RECORDS do not fit the schema: {error.message[:200]}")
    return part


def result_duration(value: Any, key: str) -> float | None:
    """A duration reported by the peer: a finite non-negative number (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise WireError(f"result meta {key}={str(value)[:40]!r} is not a duration in seconds")
    return float(value)


def result_bytes(value: Any, key: str) -> int:
    """A byte count reported by a later stage: a non-negative integer below 2**48."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 48:
        raise WireError(f"result meta {key}={str(value)[:40]!r} is not a byte count")
    return value


def read_result_meta(meta: dict[str, Any], num_stages: int, sealed: bool, first: int = 2) -> dict[str, Any]:
    """What the later stages reported in a result's meta, each value checked: every stage's
    durations (and, sealed, the seconds it took to open its frame) and, in a chain, the bytes each
    middle stage sent on to the next (stages ``first`` to ``num_stages``)."""
    out: dict[str, Any] = {}
    for stage in range(first, num_stages + 1):
        keys = result_meta_fields(stage) + ((f"stage{stage}_open_s",) if sealed else ())
        out.update({k: result_duration(meta.get(k), k) for k in keys})
        if stage < num_stages:
            key = f"stage{stage}_wire_bytes"
            out[key] = result_bytes(meta.get(key), key)
    return out


#: The most segments a result may report times for (a model's boundaries are far fewer).
MAX_SEGMENTS = 4096


def read_segment_times(meta: dict[str, Any], segments: int) -> tuple[int, list[float]]:
    """An adaptive stage 2's per-segment compute of a batch (``stage2_segment_first`` and
    ``stage2_segment_s``), checked against the run's ``segments``: (first, times), or (0, [])
    when the result carries none."""
    first, times = meta.get("stage2_segment_first"), meta.get("stage2_segment_s")
    if first is None and times is None:
        return 0, []
    if not (isinstance(first, int) and not isinstance(first, bool) and isinstance(times, list)
            and len(times) <= MAX_SEGMENTS and 0 <= first and first + len(times) <= segments):
        raise WireError(f"a result's segment times ({str(first)[:20]}, {len(times) if isinstance(times, list) else '?'} "
                        f"values) do not fit the run's {segments} segments")
    if any(t is None for t in times):
        raise WireError("a result's segment times hold an empty value")
    return first, [float(result_duration(t, "stage2_segment_s")) for t in times]


def json_tensor(obj: dict[str, Any]) -> torch.Tensor | None:
    """A JSON object as a frame's uint8 payload (None for an empty one)."""
    raw = json.dumps(obj, default=records.json_default).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else None


def json_payload(f: wire.Frame) -> Any:
    """The JSON a frame carries as its uint8 payload, bounded in size and depth; the frame's buffer
    goes back to its pool either way."""
    if f.tensor is None or f.tensor.dtype != torch.uint8:
        f.release()
        raise WireError(f"{wire.KIND_NAMES[f.kind]} frame must carry a uint8 JSON payload")
    try:
        return wire.loads_bounded(bytes(f.tensor.numpy()))
    finally:
        f.release()
