"""Run records: per-batch records, run manifest, summaries, and atomic JSON/CSV writing.

Latency is always a difference of two readings of ONE monotonic clock (the source's); per-stage
times are durations measured by the node that did the work. Throughput is completed items over
the measured window. See docs/records.md for every field and its unit.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import re
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import UsageError
from .energy import summary as energy_summary

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SCHEMA_VERSION = 2
SCHEMA_FILE = Path(__file__).with_name("run.schema.json")
BOOTSTRAP_RESAMPLES = 2000
#: A run's status: measured in full; stopped by the user's --max-batch-s (a measured outcome, never
#: retried); or cut short by a failure (its error says which).
COMPLETE, INFEASIBLE, INCOMPLETE = "complete", "infeasible", "incomplete"
STATUSES = (COMPLETE, INFEASIBLE, INCOMPLETE)

# Per-batch duration fields subtracted from latency to get the transfer time: every stage's
# compute, codec and queue parts (any number of stages), and decoding the result.
WORK_FIELDS = ("stage1_compute_s", "stage1_encode_s", "stage2_decode_s", "stage2_queue_s",
               "stage2_compute_s", "stage2_encode_s", "result_decode_s")
# local_compute_s: an adaptive run's batch finished on stage 1 (stage 2 gone or late).
# seal/open: an encrypted connection's per-frame AEAD (stage1_seal_s is part of stage1_send_s).
_WORK = re.compile(r"^(stage\d+_(compute|encode|decode|queue|seal|open)_s|result_(decode|open)_s|local_compute_s)$")


def work_fields(batch: dict[str, Any]) -> list[str]:
    """The fields of a batch (or a result's meta) that are some stage's work, not the network's."""
    return [k for k in batch if _WORK.match(k)]


def stage_figures(summary: dict[str, Any], figure: str) -> list[Any]:
    """``figure`` of every stage in order (``compute_median_s``: stage 1's, stage 2's, ...), as far
    as the summary has stages: the one reader of the record's ``stageN_<figure>`` columns."""
    out = []
    while f"stage{len(out) + 1}_{figure}" in summary:
        out.append(summary[f"stage{len(out) + 1}_{figure}"])
    return out


def throughput_of(summary: Mapping[str, Any]) -> float | None:
    """A run's completed items per second: images, or a generation's tokens (whose image figure is null)."""
    value = summary.get("throughput_imgs_per_s")
    return value if value is not None else summary.get("tokens_per_s")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def file_label(text: str) -> str:
    """``text`` as part of a file name: letters, digits and ``._-`` only, never a path. A user's
    model (``examples/models/skipnet.py:build``) or network name may hold anything."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).replace("..", "_").strip("._")
    return label or "_"


def new_run_id(model: str, split: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{file_label(model)}-{file_label(split)}-{stamp}-{uuid.uuid4().hex[:6]}"


def small_file_key(path: str | os.PathLike, what: str, limit: int) -> tuple[str, int]:
    """``path`` checked to name a file of at most ``limit`` bytes (one line naming the fault, with
    ``what`` saying what the file is for); its resolved path and modification time, the key a
    loader caches its parsed content under."""
    p = Path(path).expanduser()
    try:
        stat = p.stat()
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {p}")
    if not p.is_file():
        raise UsageError(f"{what} {p} is not a file")
    if stat.st_size > limit:
        raise UsageError(f"{what} {p} is {stat.st_size} bytes; the limit is {limit}")
    return str(p.resolve()), stat.st_mtime_ns


def read_text_file(path: str, what: str, expected: str) -> str:
    """A file's text, or one line saying it is not text and what ``expected`` format it should be."""
    try:
        return Path(path).read_text()
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not text ({expected})")


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a float: how a CSV's first row tells a header from data."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write via a temp file in the same folder + fsync + rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False, allow_nan=False,
                                              default=json_default) + "\n")


def atomic_write_csv(path: str | os.PathLike, rows: Sequence[dict[str, Any]],
                     fields: Sequence[str] | None = None) -> Path:
    fields = list(fields or _union_keys(rows))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return atomic_write_text(path, buf.getvalue())


def _union_keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return list(keys)


def json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# -- statistics ----------------------------------------------------------------------------------
def _percentile(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


def bootstrap_ci(xs: Sequence[float], stat=np.median, seed: int = 0,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap CI of ``stat`` (seeded, so reproducible)."""
    arr = np.asarray([x for x in xs if x is not None], dtype=float)
    if arr.size == 0:
        return None, None
    if arr.size == 1:
        return float(arr[0]), float(arr[0])
    rng = np.random.default_rng(seed)
    samples = stat(arr[rng.integers(0, arr.size, size=(resamples, arr.size))], axis=1)
    return float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))


def median_ci(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
    """95% CI of the median of the population a configuration's runs come from.

    A t interval on the logs of the runs: exact when runs are log-normal (their median is the
    exponential of the log mean), and honest at the 3-6 runs a sweep affords. The percentile
    bootstrap of the median cannot reach past the extreme runs, so it holds the true median only
    74% of the time at 3 runs and 89% at 4 (``benchmarks/noise_floor.py``): ties were
    under-reported and fronts flipped between reruns. The interval is widened, if ever needed, to
    hold the sample median, the point every table and figure shows. A value <= 0 (nothing to take
    a log of) makes it a t interval on the values themselves. One run gives no spread: (x, x).
    """
    arr = np.asarray([x for x in xs if x is not None and x == x], dtype=float)
    if arr.size == 0:
        return None, None
    mid = float(np.median(arr))
    if arr.size == 1:
        return mid, mid
    from scipy.special import stdtrit  # scipy.stats costs 0.5 s to import; this one quantile does not

    t = float(stdtrit(arr.size - 1, 0.975))
    logs = arr.min() > 0
    vals = np.log(arr) if logs else arr
    centre, half = float(np.mean(vals)), t * float(np.std(vals, ddof=1)) / float(np.sqrt(arr.size))
    lo, hi = centre - half, centre + half
    if logs:
        lo, hi = float(np.exp(lo)), float(np.exp(hi))
    return min(lo, mid), max(hi, mid)


def describe(xs: Sequence[float], prefix: str, unit: str = "s") -> dict[str, float | None]:
    xs = [x for x in xs if x is not None]
    lo, hi = bootstrap_ci(xs)
    return {f"{prefix}_mean_{unit}": statistics.fmean(xs) if xs else None,
            f"{prefix}_median_{unit}": _percentile(xs, 50),
            f"{prefix}_p95_{unit}": _percentile(xs, 95),
            f"{prefix}_p99_{unit}": _percentile(xs, 99),
            f"{prefix}_median_ci95_low_{unit}": lo,
            f"{prefix}_median_ci95_high_{unit}": hi}


def _median(batches: list[dict], key: str) -> float | None:
    xs = [b[key] for b in batches if b.get(key) is not None]
    return float(np.median(xs)) if xs else None


def transfer_time(batch: dict[str, Any]) -> float | None:
    """Latency minus every measured compute, codec and queue part: time on the network."""
    if batch.get("latency_s") is None:
        return None
    return batch["latency_s"] - sum(batch.get(k) or 0.0 for k in work_fields(batch))


def throughput_window(starts: Sequence[float], ends: Sequence[float]) -> tuple[int, float | None]:
    """(items, seconds) of the steady-state window: from the first measured batch's completion to
    the last, and the completions after the first. Counting from a completion leaves out the
    pipeline's fill, so a run with warm-up batches and one without (a warm cut in a sweep) measure
    the same thing; a window that began at the first start would charge the fill, one latency,
    to the runs without warm-up only. One measured batch: its own latency. The cost model's
    replay uses this same rule, so prediction and measurement compare alike."""
    if not ends:
        return 0, None
    if len(ends) == 1:
        window = ends[0] - starts[0]
        return 1, (window if window > 0 else None)
    first, last = min(ends), max(ends)
    window = last - first
    return len(ends) - 1, (window if window > 0 else None)


def summarize(batches: Sequence[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """Summary over the measured (non-warm-up) batches that completed."""
    measured = [b for b in batches if not b.get("warmup") and b.get("latency_s") is not None]
    warm = [b for b in batches if b.get("warmup") and b.get("end_s") is not None]
    # A LoadGen run's batches are its queries, of several sizes (Offline's last is short).
    sizes = [b.get("images", batch_size) for b in measured]
    out: dict[str, Any] = {"batches_measured": len(measured), "batches_warmup": len(warm),
                           "images_measured": sum(sizes)}
    out.update(describe([b["latency_s"] for b in measured], "latency"))
    starts, ends = [b["start_s"] for b in measured], [b["end_s"] for b in measured]
    items, window = throughput_window(starts, ends)
    out["measured_window_s"] = window
    # The time measured batches were in the pipeline, fill included: what a sweep spends measuring.
    out["measured_span_s"] = max(ends) - min(starts) if ends else None
    # The images completed after the first completion (every image of a run of one batch).
    counted = sum(sizes) - (sizes[ends.index(min(ends))] if items < len(ends) else 0)
    out["throughput_imgs_per_s"] = counted / window if window else None
    keys = dict.fromkeys(WORK_FIELDS + ("stage1_send_s",))
    for b in measured:
        keys.update(dict.fromkeys(work_fields(b)))
    for key in keys:
        out[key[:-2] + "_median_s"] = _median(measured, key)
        # Means add up: per batch latency = work parts + transfer exactly, so their means sum to
        # the mean latency (medians do not), which is what the breakdown figure stacks.
        xs = [b[key] for b in measured if b.get(key) is not None]
        out[key[:-2] + "_mean_s"] = statistics.fmean(xs) if xs else None
    transfers = [transfer_time(b) for b in measured]
    out.update(describe(transfers, "transfer"))
    payload = [b["payload_bytes"] for b in measured if b.get("payload_bytes") is not None]
    wire = [b["wire_bytes"] for b in measured if b.get("wire_bytes") is not None]
    result = [b["result_wire_bytes"] for b in measured if b.get("result_wire_bytes") is not None]
    out["payload_bytes_mean"] = statistics.fmean(payload) if payload else None
    out["wire_bytes_mean"] = statistics.fmean(wire) if wire else None
    out["result_wire_bytes_mean"] = statistics.fmean(result) if result else None
    total_bits = 8 * (sum(wire) + sum(result))
    total_transfer = sum(t for t in transfers if t is not None)
    out["goodput_mbit_per_s"] = total_bits / total_transfer / 1e6 if total_transfer > 0 and wire else None
    if any("served_locally" in b for b in measured):  # a guarded run: adaptive, or a static one with a deadline
        out["batches_served_locally"] = sum(bool(b.get("served_locally")) for b in measured)
    if any("split_k" in b for b in measured):  # the adaptive runtime's batches
        out["split_switches"] = sum(bool(b.get("switched")) for b in measured)
        ks = [b["split_k"] for b in measured if b.get("split_k") is not None]
        out["split_k_median"] = statistics.median(ks) if ks else None
    return out


def build_run_record(*, backend: str, run_id: str, status: str, error: str | None,
                     config: dict[str, Any], manifest: dict[str, Any],
                     batches: Sequence[dict[str, Any]], sysmon: dict[str, Any],
                     timing: dict[str, Any] | None = None,
                     resources: dict[str, Any] | None = None, loadgen: Any = None) -> dict[str, Any]:
    """The one JSON document per run (schema in run.schema.json, fields in docs/records.md);
    ``resources``: each stage's energy and memory (``stage1``, ...), summarised beside the timings;
    ``loadgen``: a LoadGen run's harness (``paretopipe.loadgen``), whose figures join the summary."""
    record = {"schema_version": SCHEMA_VERSION, "backend": backend, "run_id": run_id,
              "status": status, "error": error, "created_utc": utc_now(), "config": config,
              "manifest": manifest, "timing": timing or {}, "batches": list(batches),
              "sysmon": sysmon, "summary": summarize(batches, int(config["batch_size"]))}
    if resources:
        record["resources"] = resources
        record["summary"].update(energy_summary.summarize(resources, manifest.get("stages") or [], config))
    record["summary"].update(energy_summary.link_energy(manifest.get("link") or {}, record["summary"],
                                                        int(config["batch_size"])))
    if loadgen is not None:
        record["loadgen"] = loadgen.part()
        record["summary"].update(loadgen.summary_figures())
    return record


def write_run_json(path: Path, record: dict[str, Any]) -> Path:
    """Write a run record atomically; a LoadGen run's logs go beside it first, as files in
    ``<record name>.mlperf/`` (the record then names them instead of holding their text)."""
    lg = record.get("loadgen")
    if isinstance(lg, dict) and isinstance(lg.get("logs"), dict) and lg["logs"] and \
            all(isinstance(v, str) for v in lg["logs"].values()):
        folder = path.with_name(path.stem + ".mlperf")
        for name, text in lg["logs"].items():
            target = (folder / name).resolve()
            if folder.resolve() not in target.parents:
                raise UsageError(f"a LoadGen log named {name[:60]!r} is not inside the run's folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, text)
        record = {**record, "loadgen": {**lg, "logs": {"folder": folder.name, "files": sorted(lg["logs"])}}}
    return atomic_write_json(path, record)



def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def read_toml(path: Path, what: str, kind: str = "TOML") -> dict[str, Any]:
    """A TOML file as a dict; each way it can be wrong is one line naming ``what`` it should be."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}")
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a folder; give a {kind} file")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path} is not valid TOML: {exc}")
