"""A run record as a checked type: :class:`RunRecord` (the JSON document of one run, read back with
every key checked by name) and its :class:`RunSummary` (the figures, read-only). Where a record
crosses into the controller (a worker's ``done`` event, a resumed file) it becomes one of these;
building and writing records is :mod:`paretopipe.records`."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from . import strict
from .errors import UsageError
from .records import STATUSES, stage_figures


#: A summary figure's name: lower-case words joined by ``_`` (``stage2_compute_median_s``).
_FIGURE = re.compile(r"[a-z][a-z0-9_]{0,95}")
#: Text a summary may hold (where a modelled constant came from): short, never a document.
MAX_FIGURE_TEXT = 200


class RunSummary(Mapping[str, Any]):
    """A run's summary, read-only and checked: every figure is a number, a flag, a short text or
    null under a figure's name. The figures every run has are attributes; a stage's figure is
    :meth:`stage` or :meth:`stages`, never a key its reader builds. It reads as the mapping it was
    written as (``summary["latency_median_s"]``), so tables and the rounds take it as they are."""
    REQUIRED = ("batches_measured", "latency_median_s", "throughput_imgs_per_s")
    __slots__ = ("_figures",)

    def __init__(self, figures: Any, what: str = "run summary") -> None:
        if not isinstance(figures, dict):
            raise UsageError(f"{what}: expected an object, got {type(figures).__name__}")
        for key, value in figures.items():
            if not (isinstance(key, str) and _FIGURE.fullmatch(key)):
                raise UsageError(f"{what}: {str(key)[:60]!r} is not a figure's name")
            if not (value is None or isinstance(value, (bool, int, float))
                    or isinstance(value, str) and len(value) <= MAX_FIGURE_TEXT):
                raise UsageError(f"{what}.{key}: {str(value)[:60]!r} is not a number, a flag, a short text or null")
        missing = [k for k in self.REQUIRED if k not in figures]
        if missing:
            raise UsageError(f"{what}: missing {missing[0]!r}")
        if isinstance(figures["batches_measured"], bool) or not isinstance(figures["batches_measured"], int):
            raise UsageError(f"{what}.batches_measured: expected an integer, got {figures['batches_measured']!r}")
        self._figures = dict(figures)

    @classmethod
    def from_checked(cls, value: Any, path: str) -> "RunSummary":
        """``strict``'s hook: a record's ``summary`` field is read as this type."""
        return cls(value, path)

    def __getitem__(self, key: str) -> Any:
        return self._figures[key]

    def __iter__(self):
        return iter(self._figures)

    def __len__(self) -> int:
        return len(self._figures)

    def __repr__(self) -> str:
        return f"RunSummary({self._figures!r})"

    @property
    def batches_measured(self) -> int:
        return self._figures["batches_measured"]

    @property
    def latency_median_s(self) -> float | None:
        return self._figures["latency_median_s"]

    @property
    def throughput_imgs_per_s(self) -> float | None:
        return self._figures["throughput_imgs_per_s"]

    @property
    def measuring_s(self) -> float:
        """How long the run spent measuring: its span, fill included (a record from before spans:
        its window)."""
        return self._figures.get("measured_span_s") or self._figures.get("measured_window_s") or 0.0

    def stage(self, j: int, figure: str) -> Any:
        """Stage ``j``'s (from 1) ``figure``, e.g. ``stage(2, "compute_median_s")``; None if absent."""
        return self._figures.get(f"stage{j}_{figure}")

    def stages(self, figure: str) -> list[Any]:
        """``figure`` of every stage in order (:func:`stage_figures`)."""
        return stage_figures(self._figures, figure)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._figures)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run's record as a type: what :func:`build_run_record` writes, read back with ``strict``
    where it crosses into the controller (a worker's ``done`` event, a resumed file). Its JSON form
    (:meth:`to_dict`) is the record format unchanged (docs/records.md)."""
    schema_version: int
    backend: str
    run_id: str
    status: str
    error: str | None = None
    created_utc: str
    config: dict[str, Any]
    manifest: dict[str, Any]
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)
    batches: Any = dataclasses.field(default_factory=list)  # list of batch dicts: any length, so not strict's
    sysmon: dict[str, Any] = dataclasses.field(default_factory=dict)
    summary: RunSummary
    resources: dict[str, Any] | None = None
    loadgen: dict[str, Any] | None = None  # a LoadGen run's settings, steps and logs (paretopipe.loadgen)
    generation: dict[str, Any] | None = None  # a language model's prompts, tokens and stages (transport.generation)

    @classmethod
    def of(cls, data: Any, what: str = "run record") -> "RunRecord":
        """A record from its JSON object; an unknown, missing or mistyped key is refused by name."""
        record = strict.from_dict(cls, data, what)
        if not isinstance(record.batches, list):
            raise UsageError(f"{what}.batches: expected a list, got {type(record.batches).__name__}")
        if record.status not in STATUSES:
            raise UsageError(f"{what}.status: {record.status[:40]!r}; valid: {', '.join(STATUSES)}")
        return record

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("summary", "resources", "loadgen", "generation")}
        out["summary"] = self.summary.to_dict()
        for optional in ("resources", "loadgen", "generation"):
            if getattr(self, optional) is not None:
                out[optional] = getattr(self, optional)
        return out
