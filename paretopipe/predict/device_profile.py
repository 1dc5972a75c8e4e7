"""Device profiles, read: each segment's compute time between consecutive fine cuts on one device,
with activation bytes, FLOPs and codec costs. Written by :mod:`paretopipe.predict.measure`.

A model with n fine cuts has n + 2 boundaries (``input``, the cuts, ``output``) and n + 1
segments, segment i running from boundary i to boundary i + 1. Any split's stage time is a sum of
consecutive segments, so one profile answers every split (and every multi-device plan). Reading
a profile needs no torch: the cost model and the planner are arithmetic on these numbers.
"""

from __future__ import annotations

import copy
import json
import statistics
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError

SCHEMA = "paretopipe.profile/1"
DEFAULT_CODECS = ("float32/none", "float16/none", "float32/zstd", "float32/lz4")
RESULT_CODEC = "float32/none"  # the last stage always returns its result uncompressed in float32


def codec_key(wire_dtype: str, compression: str, cipher: str = "none") -> str:
    """How frames travel, as the cost model names it: ``float16/zstd``, sealed ``float16/zstd+aesgcm``."""
    return f"{wire_dtype}/{compression}" + (f"+{cipher}" if cipher != "none" else "")


def split_codec(key: str) -> tuple[str, str]:
    """(the codec's key in a profile's codec table, the cipher or ``none``) of a :func:`codec_key`."""
    codec, _, cipher = key.partition("+")
    return codec, cipher or "none"


def resolve_cipher(choice: str, profiles: Sequence["DeviceProfile"]) -> str:
    """``--encrypt auto`` as the stages would settle it (AES-GCM only when every device reports AES
    instructions, as :func:`paretopipe.transport.aead.resolve` does); other choices as they are."""
    if choice != "auto":
        return choice
    known = [p.doc.get("aes_instructions") for p in profiles]
    if any(k is None for k in known):
        raise UsageError("--encrypt auto: a device profile does not say whether its CPU has AES instructions "
                         "(profiled before ciphers were timed); profile again, or name the cipher")
    return "aesgcm" if all(known) else "chacha20"


def installed_torch_version() -> str | None:
    """torch's version without importing torch (the predictor runs where torch is absent)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


class DeviceProfile:
    """A loaded device profile with the lookups the cost model needs."""

    def __init__(self, doc: dict[str, Any], path: str | None = None) -> None:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise UsageError(f"{path or 'profile'} is not a ParetoPipe device profile (schema {got!r}, "
                             f"expected {SCHEMA}); make one with paretopipe profile")
        self.doc, self.path = doc, path or "profile"
        try:
            self.model: str = doc["model"]
            self.boundaries: list[str] = [b["name"] for b in doc["boundaries"]]
            self.blocks: dict[int, int] = {int(k): int(v) for k, v in doc["blocks"].items()}
            if not isinstance(doc["by_batch"], dict) or not doc["by_batch"]:
                raise ValueError("no batch sizes")
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{self.path} is a damaged device profile ({type(exc).__name__}: {exc}); "
                             f"profile the device again")

    @classmethod
    def load(cls, path: str | Path) -> "DeviceProfile":
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"device profile not found: {path} (make it with paretopipe profile --model M "
                             f"--out {path})")
        except (OSError, ValueError) as exc:
            raise UsageError(f"device profile {path} is not readable JSON: {exc}")
        return cls(doc, str(path))

    @classmethod
    def load_spec(cls, spec: str) -> "DeviceProfile":
        """``a.json`` or ``a.json+b.json``: profiles of one device taken at different times (for
        example before and after a long sweep) are averaged, which halves the effect of the
        machine's speed drifting in between."""
        parts = [p.strip() for p in spec.split("+") if p.strip()]
        if not parts:
            raise UsageError(f"empty device profile name {spec!r}: give a file, or a.json+b.json to average two")
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
    def engine(self) -> str:
        """The engine the profile timed (paretopipe.engines); torch for profiles from before engines."""
        return (self.doc.get("engine") or {}).get("engine") or "torch"

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
        ranged = (per.get("range_compute_s") or {}).get(f"{start}:{stop}")
        if ranged is not None:  # an engine's stage, timed as one export (predict.measure._range_times)
            return float(ranged)
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

    def stage_memory_bytes(self, b: int, start: int, stop: int) -> int | None:
        """What a stage running segments start..stop-1 holds of the model: their parameters and
        buffers, plus their largest activation at batch ``b`` (None for a profile without them)."""
        segments = self.doc.get("segments") or []
        if not segments or any("param_bytes" not in s for s in segments):
            return None
        own = segments[start:stop]
        return sum(int(s["param_bytes"]) for s in own) + \
            max((int(s["activation_peak_bytes_per_image"]) * b for s in own), default=0)

    def cipher_s(self, cipher: str, op: str, nbytes: int) -> float:
        """Sealing (``op`` seal) or opening (open) one frame of ``nbytes`` with ``cipher`` on this device."""
        table = self.doc.get("ciphers") or {}
        if cipher not in table:
            raise UsageError(f"{self.path} has no {cipher} timings (it has {', '.join(table) or 'none'}); profile "
                             f"the device again with --ciphers {cipher}")
        fit = table[cipher][op]  # transport.aead.time_cipher's fixed + bytes / rate
        return float(fit.get("fixed_s") or 0.0) + (nbytes / fit["bytes_per_s"] if fit.get("bytes_per_s") else 0.0)


def average(profiles: Sequence[DeviceProfile]) -> DeviceProfile:
    """One profile whose timings are the means of ``profiles`` (same model, cuts and batch sizes)."""
    first = profiles[0]
    for p in profiles[1:]:
        if p.engine != first.engine:
            raise UsageError(f"cannot average {p.path} ({p.engine}) with {first.path} ({first.engine}): they time "
                             f"different engines")
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
    if all("ciphers" in p.doc for p in profiles):
        doc["ciphers"] = {c: {op: mean([p.doc["ciphers"][c][op] for p in profiles]) for op in ("seal", "open")}
                          for c in first.doc["ciphers"] if all(c in p.doc["ciphers"] for p in profiles)}
    doc["averaged_from"] = [p.path for p in profiles]
    return DeviceProfile(doc, "+".join(p.path for p in profiles))


def _name_key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def check_compatible(profiles: Sequence[DeviceProfile], model: str | None = None) -> list[str]:
    """Refuse profiles of another model (or of different cut lists); return warnings for softer
    differences (torch version), which change timings but not the structure. Names compare as the
    zoo does (case, dashes and underscores ignored: the anchor's ``mobilenetv2`` is ``mobilenet_v2``)."""
    key = _name_key(model or profiles[0].model)
    wanted = next((p.model for p in profiles if _name_key(p.model) == key), model or profiles[0].model)
    for p in profiles:
        if _name_key(p.model) != key:
            raise UsageError(f"{p.path} profiles {p.model}, not {wanted}: profile each device with "
                             f"paretopipe profile --model {wanted}")
        if p.boundaries != profiles[0].boundaries:
            raise UsageError(f"{p.path} and {profiles[0].path} disagree on the cut points of {wanted} "
                             f"(different torch/torchvision graphs); profile both with the same versions")
    warnings = []
    versions = {p.torch_version for p in profiles}
    local = installed_torch_version()
    for p in profiles:
        # The package metadata has no local suffix (2.14.1); torch.__version__ may (2.14.1+cu130).
        if local is not None and str(p.torch_version).split("+")[0] != local.split("+")[0]:
            warnings.append(f"{p.path} was measured with torch {p.torch_version}, this is torch {local}: "
                            f"timings may not carry over")
    if len(versions) > 1:
        warnings.append(f"the profiles come from different torch versions ({', '.join(sorted(map(str, versions)))})")
    return warnings


def synthetic_profile(segments_s: Sequence[float], bytes_per_image: Sequence[int], *, source_s: float = 0.0,
                      encode_s: float = 0.0, decode_s: float = 0.0, frame_overhead: int = 0,
                      blocks: dict[int, int] | None = None, model: str = "mobilenet_v2",
                      torch_version: str | None = None, call_overhead_s: float = 0.0,
                      host: str = "testhost", ciphers: dict[str, Any] | None = None,
                      aes_instructions: bool | None = None) -> DeviceProfile:
    """A profile with hand-chosen numbers (exact cost-model tests, planner benchmarks):
    ``len(segments_s)`` segments; ``bytes_per_image`` has one entry per boundary; ``ciphers`` as
    ``transport.aead.time_cipher`` writes them (``{"aesgcm": {"seal": {...}, "open": {...}}}``)."""
    if len(bytes_per_image) != len(segments_s) + 1:
        raise ValueError("bytes_per_image needs one entry per boundary (segments + 1)")
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
           "manifest": {"torch": torch_version or installed_torch_version(), "torch_threads": 1, "hostname": host,
                        "limits": {}}}
    if ciphers is not None:
        doc["ciphers"] = ciphers
    if aes_instructions is not None:
        doc["aes_instructions"] = aes_instructions
    return DeviceProfile(doc, f"{model}-synthetic.json")
