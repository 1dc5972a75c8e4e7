"""Faults as a treatment: what a sweep does to a run at one of its batches, for how long, and the
figures that say what it cost.

``stage2:kill@B+S`` kills stage 2's process (SIGKILL) as measured batch B starts and starts a new
one S seconds later; ``stage2:freeze@B+S`` stops it (SIGSTOP) for S seconds; ``link:down@B+S``
lets the link between the stages carry nothing for S seconds (what was sent arrives once it is
back, as TCP delivers it). Stage 1 survives each by its deadline (``--deadline-ms``): a result
that does not come in time, or a stage 2 that is gone, is finished on stage 1 from the activation
it already computed, and a stage 2 that connects again gets the next batches.

Per run (:func:`outage_figures`, from stage 1's batch records): when the fault began, how long
until stage 1 stopped waiting for stage 2 (``fault_detect_s``), the batches it served itself
meanwhile, how long until the split was whole again (``fault_recover_s``: a batch served by stage 2
after the last one served locally), the latency p99 inside that window, what the outage cost
(``fault_cost_s``: the window's batch-seconds beyond as many at the run's median before the
fault), and the batches lost or served twice (both must be 0). A fault run goes on past its
planned batches until the split is whole again (``fault_extra_batches``)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

from .errors import UsageError

NONE = "none"
#: What each target can suffer.
KINDS = {"stage2": ("kill", "freeze"), "link": ("down",)}
_FORM = re.compile(r"^(?P<target>[a-z0-9]+):(?P<kind>[a-z]+)@(?P<batch>\d+)\+(?P<seconds>\d+(\.\d+)?)$")
VALID = "none, stage2:kill@B+S, stage2:freeze@B+S, link:down@B+S (at measured batch B, for S seconds)"
#: The per-run figures (runs.csv) that summary.csv gives a median over runs.
COLUMNS = re.compile(r"^fault_(start|detect|served_locally|recover|window_p99|cost|lost|duplicated|extra_batches)(_s)?$")


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: ``target`` (stage2, link) suffers ``kind`` from measured batch ``at_batch`` for
    ``seconds``."""

    target: str
    kind: str
    at_batch: int
    seconds: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS.get(self.target, ()):
            raise UsageError(f"--fault {self.target}:{self.kind}: valid {VALID}")
        if self.at_batch < 0 or not 0 < self.seconds <= 600:
            raise UsageError(f"--fault {self.label}: B is a measured batch (0 or more) and S seconds in (0, 600]")

    @property
    def label(self) -> str:
        return f"{self.target}:{self.kind}@{self.at_batch}+{self.seconds:g}"


def parse_fault(text: str) -> Fault | None:
    """``none`` or ``target:kind@B+S`` (None for none); a malformed one is one line naming the forms."""
    text = text.strip().lower()
    if text == NONE:
        return None
    m = _FORM.match(text)
    if m is None:
        raise UsageError(f"--fault {text!r}: valid {VALID}")
    return Fault(m["target"], m["kind"], int(m["batch"]), float(m["seconds"]))


def parse_faults(text: str) -> list[str]:
    """``--fault``'s comma list as canonical labels (``none`` stays), each checked, none twice."""
    labels = [NONE if (f := parse_fault(part)) is None else f.label for part in text.split(",") if part.strip()]
    if not labels:
        raise UsageError(f"--fault: give at least one of {VALID}")
    if len(set(labels)) != len(labels):
        raise UsageError(f"--fault {text}: a fault is named twice")
    return labels


def outage_figures(batches: Sequence[dict[str, Any]], fault: Fault, start_s: float | None,
                   expected: int) -> dict[str, Any]:
    """A fault run's figures from stage 1's measured batch records, those it started whether or not
    they ended (``start_s`` on the batch clock: when the fault began; ``expected``: the measured
    batches the run was to serve at least: it goes on until the split is whole again)."""
    served = [b for b in batches if "end_s" in b]
    seqs = [b["seq"] for b in served]
    lost = len(batches) - len(served) + max(0, expected - len(batches))
    out: dict[str, Any] = {"fault": fault.label, "fault_start_s": start_s, "fault_lost": lost,
                           "fault_duplicated": len(seqs) - len(set(seqs)),
                           "fault_extra_batches": max(0, len(batches) - expected)}
    if start_s is None:  # the run ended before batch B
        return {**out, "fault_detect_s": None, "fault_served_locally": 0, "fault_recover_s": None,
                "fault_window_p99_s": None, "fault_cost_s": None}
    after = sorted((b for b in served if b["end_s"] > start_s), key=lambda b: b["seq"])
    local = [b for b in after if b.get("served_locally")]
    gave_up = [b["gave_up_s"] for b in local if b.get("gave_up_s") is not None]
    out["fault_detect_s"] = round(min(gave_up) - start_s, 6) if gave_up else None
    out["fault_served_locally"] = len(local)
    # Whole again: the first batch stage 2 served after the last one served here (or after the
    # fault's own end, where stage 1 never had to serve one).
    last_local = local[-1]["seq"] if local else None
    back = next((b for b in after if not b.get("served_locally") and
                 (b["seq"] > last_local if last_local is not None else b["start_s"] >= start_s + fault.seconds)), None)
    out["fault_recover_s"] = round(back["end_s"] - start_s, 6) if back else None
    until = back["end_s"] if back else math.inf
    window = [b["latency_s"] for b in after if b["start_s"] < until]
    out["fault_window_p99_s"] = _p99(window)
    # What the outage cost: the window's batch-seconds beyond as many batches at the run's own median
    # before the fault (negative where serving on stage 1 alone was faster than the split).
    before = sorted(b["latency_s"] for b in served if b["end_s"] < start_s)
    out["fault_cost_s"] = round(sum(window) - len(window) * before[len(before) // 2], 6) if before and window else None
    return out


def _p99(values: Sequence[float]) -> float | None:
    """The 99th percentile by nearest rank: a latency that was measured, never an interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
