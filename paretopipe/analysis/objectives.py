"""The objectives a front is drawn over: ``--objectives latency,throughput,energy,memory`` (any
subset of two or more), each with its column in summary.csv, its direction and its 95% CI columns.

A language model's session draws its fronts over ``ttft,tpot`` unless told otherwise; there
``throughput`` is tokens/s, ``latency`` a step's (a prefill or one token), ``energy`` per token.

``energy`` is the pipeline's joules per image and ``energy_stageN`` one device's: measured where
the stages had sensors, else modelled (from declared powers), and the objective's label says
which; a measured and a modelled figure are never mixed in one objective. ``memory`` is the
largest stage's own footprint, its parameters and buffers plus its largest activation (what a
device that loads only its part of the model needs beyond the runtime), ``memory_stageN`` one
stage's; ``memory_rss`` and ``memory_rss_stageN`` are the measured peak resident memory of the
stage processes, which in this suite's workers hold the whole model (they re-partition in place).
The ``loadgen_*`` objectives are MLPerf LoadGen's figures of a session swept under a scenario
(``--scenario``): ``loadgen_p90`` and ``loadgen_p99`` latencies, a language model's
``loadgen_ttft_p90``/``_p99`` and ``loadgen_tpot_p90``/``_p99``, ``loadgen_samples`` and
``loadgen_tokens`` per second, and ``loadgen_server_qps``, the Server's rate within its bounds.

``fidelity`` is the split's top-1 agreement with the unsplit float32 model and ``accuracy`` its
top-1 accuracy on a labelled dataset, both from the evaluation pass of runs whose wire is lossy
(``--eval-samples``; give it to a float32 run to measure that too): a configuration without the
figure is left out of that front.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import pandas as pd

from .. import workload
from ..errors import UsageError
from ..workload import GENERATION, IMAGES, Workload

DEFAULT = IMAGES.default_objectives
#: A language model's session: time to first token against time per output token.
GENERATION_DEFAULT = GENERATION.default_objectives
#: MLPerf LoadGen's figures as objectives: name -> (summary column, sense, label).
LOADGEN = {"loadgen_p90": ("loadgen_latency_p90_s", "min", "LoadGen p90 latency (s)"),
           "loadgen_p99": ("loadgen_latency_p99_s", "min", "LoadGen p99 latency (s)"),
           "loadgen_ttft_p90": ("loadgen_ttft_p90_s", "min", "LoadGen p90 time to first token (s)"),
           "loadgen_ttft_p99": ("loadgen_ttft_p99_s", "min", "LoadGen p99 time to first token (s)"),
           "loadgen_tpot_p90": ("loadgen_tpot_p90_s", "min", "LoadGen p90 time per output token (s)"),
           "loadgen_tpot_p99": ("loadgen_tpot_p99_s", "min", "LoadGen p99 time per output token (s)"),
           "loadgen_samples": ("loadgen_samples_per_s", "max", "LoadGen samples/s"),
           "loadgen_tokens": ("loadgen_tokens_per_s", "max", "LoadGen tokens/s"),
           "loadgen_server_qps": ("loadgen_server_qps", "max", "LoadGen Server rate within its bounds (q/s)")}
NAMES = ("latency", "throughput", "ttft", "tpot", "energy", "memory", "memory_rss", "fidelity", "accuracy",
         "energy_stageN", "memory_stageN", "memory_rss_stageN", *LOADGEN)
_PER_STAGE = re.compile(r"^(energy|memory|memory_rss)_stage([1-9][0-9]?)$")


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str           # as the user wrote it
    column: str         # its column in summary.csv (runs.csv has it per run)
    sense: str          # min or max
    label: str          # axis label, with the unit and whether it is modelled
    low: str | None = None   # its 95% CI columns
    high: str | None = None

    @property
    def interval(self) -> tuple[str, str] | None:
        return (self.low, self.high) if self.low and self.high else None


LATENCY = Objective("latency", "latency_s", "min", "latency per batch, median (s)",
                    "latency_median_ci95_low_s", "latency_median_ci95_high_s")
THROUGHPUT = Objective("throughput", "throughput_imgs_per_s", "max", "throughput (images/s)",
                       "throughput_ci95_low_imgs_per_s", "throughput_ci95_high_imgs_per_s")
# A generation's (analysis.columns.GENERATION_OBJECTIVES names their CI columns).
TTFT = Objective("ttft", "ttft_median_s", "min", "time to first token, median (s)", "ttft_ci95_low_s",
                 "ttft_ci95_high_s")
TPOT = Objective("tpot", "tpot_median_s", "min", "time per output token, median (s)", "tpot_ci95_low_s",
                 "tpot_ci95_high_s")
TOKENS = Objective("throughput", "tokens_per_s", "max", "throughput (tokens/s)", "tokens_ci95_low_per_s",
                   "tokens_ci95_high_per_s")
FIDELITY = Objective("fidelity", "fidelity_top1_agreement", "max",
                     "top-1 agreement with the unsplit float32 model (evaluation pass)")
ACCURACY = Objective("accuracy", "accuracy_top1", "max", "top-1 accuracy (evaluation pass, labelled data)")
#: A generation's latency is per step (a prefill or one token), not per batch of images.
STEP_LATENCY = dataclasses.replace(LATENCY, label="latency per step, median (s)")
#: The objectives whose column depends on the workload, by workload: a name missing from one is
#: another workload's objective.
BY_WORKLOAD: dict[Workload, dict[str, Objective]] = {
    IMAGES: {"latency": LATENCY, "throughput": THROUGHPUT},
    GENERATION: {"ttft": TTFT, "tpot": TPOT, "latency": STEP_LATENCY, "throughput": TOKENS}}


def _has(table: pd.DataFrame, column: str) -> bool:
    return column in table.columns and pd.to_numeric(table[column], errors="coerce").notna().any()


def throughput_column(table: pd.DataFrame) -> str:
    """A table's throughput: images/s, or a language model's tokens/s."""
    return BY_WORKLOAD[workload.of_table(table)]["throughput"].column


def defaults(table: pd.DataFrame) -> tuple[str, ...]:
    """The objectives a table's fronts are drawn over unless named: latency and throughput, or a
    generation's time to first token and time per token."""
    return workload.of_table(table).default_objectives


def main_pair(table: pd.DataFrame) -> tuple[Objective, Objective]:
    """The two objectives of a table's first front (its workload's defaults)."""
    first, second = (resolve(name, table) for name in defaults(table))
    return first, second


def _energy(name: str, prefix: str, table: pd.DataFrame, who: str) -> Objective:
    item = workload.of_table(table).item
    for modelled in (False, True):
        stem = f"{prefix}energy{'_modelled' if modelled else ''}_per_{item}"
        if _has(table, f"{stem}_j"):
            return Objective(name, f"{stem}_j", "min", f"energy per {item}, {who} ({'modelled' if modelled else 'measured'}, J)",
                             f"{stem}_ci95_low_j", f"{stem}_ci95_high_j")
    raise UsageError(f"--objectives {name}: this session has no energy figure for {who}: no sensor was found and no "
                     f"powers were declared (sweep --power-idle-w/--power-core-w, or POWER_IDLE_W and POWER_CORE_W "
                     f"per host in .env); valid objectives here: {', '.join(available(table))}")


def _memory(name: str, column: str, table: pd.DataFrame, who: str) -> Objective:
    if not _has(table, column):
        raise UsageError(f"--objectives {name}: this session has no peak memory for {who} (records from before "
                         f"memory was measured); valid objectives here: {', '.join(available(table))}")
    stem = column[:-len("_bytes")]
    return Objective(name, column, "min", f"memory, {who} (bytes)", f"{stem}_ci95_low_bytes",
                     f"{stem}_ci95_high_bytes")


def resolve(name: str, table: pd.DataFrame) -> Objective:
    """One objective by name, against the table it will be computed on."""
    kind = workload.of_table(table)
    if name in BY_WORKLOAD[kind]:
        return BY_WORKLOAD[kind][name]
    if any(name in others for others in BY_WORKLOAD.values()):
        raise UsageError(f"--objectives {name}: not an objective of this session's workload, "
                         f"{kind} (valid here: {', '.join(available(table))})")
    if name == "energy":
        return _energy(name, "", table, "the pipeline")
    if name == "memory":
        return _memory(name, "memory_model_bytes", table, "the largest stage's parameters and activation")
    if name == "memory_rss":
        return _memory(name, "memory_peak_bytes", table, "the largest stage process's peak RSS")
    if name in LOADGEN:
        column, sense_, label = LOADGEN[name]
        if not _has(table, column):
            raise UsageError(f"--objectives {name}: this session has no {column} (sweep under a LoadGen scenario that "
                             f"reports it, --scenario ...); valid objectives here: {', '.join(available(table))}")
        return Objective(name, column, sense_, label)
    if name in ("fidelity", "accuracy"):
        found = FIDELITY if name == "fidelity" else ACCURACY
        if not _has(table, found.column):
            why = ("no run had a lossy wire or --eval-samples" if name == "fidelity" else
                   "no run evaluated labelled data (--dataset imagefolder:DIR or cifar10 with --eval-samples)")
            raise UsageError(f"--objectives {name}: this session has no {found.column}: {why}; valid objectives here: "
                             f"{', '.join(available(table))}")
        return found
    m = _PER_STAGE.match(name)
    if m:
        who, prefix = f"stage {m.group(2)}", f"stage{m.group(2)}_"
        if m.group(1) == "energy":
            return _energy(name, prefix, table, who)
        if m.group(1) == "memory":
            return _memory(name, prefix + "model_bytes", table, f"{who}'s parameters and activation")
        return _memory(name, prefix + "peak_rss_bytes", table, f"{who}'s peak RSS")
    raise UsageError(f"--objectives: unknown objective {name!r}; valid: {', '.join(NAMES)} (N: a stage number)")


def parse(text: str | Sequence[str] | None, table: pd.DataFrame) -> list[Objective]:
    """``latency,memory`` as objectives (two or more, no repeats), checked against ``table``."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else (text or defaults(table))) if n.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise UsageError(f"--objectives {','.join(names)!r}: give two or more different objectives, e.g. "
                         f"latency,throughput,energy,memory")
    return [resolve(n, table) for n in names]


def sense(name: str) -> str:
    """An objective's direction by its name alone (``max`` for throughput, fidelity, accuracy and
    LoadGen's rates)."""
    if name in LOADGEN:
        return LOADGEN[name][1]
    return "max" if name in ("throughput", "fidelity", "accuracy") else "min"


def check_names(text: str | None) -> str | None:
    """``--objectives`` checked for its names alone (before any table exists): the sweep's flag."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in NAMES and not _PER_STAGE.match(name):
            raise UsageError(f"--objectives: unknown objective {name!r}; valid: {', '.join(NAMES)} (N: a stage number)")
    if len(names) < 2 or len(set(names)) != len(names):
        raise UsageError(f"--objectives {text!r}: give two or more different objectives, e.g. latency,throughput,energy")
    return ",".join(names)


def available(table: pd.DataFrame) -> list[str]:
    """The objectives ``table`` can be computed on."""
    out = list(BY_WORKLOAD[workload.of_table(table)])
    if any(_has(table, f"energy{m}_per_{item}_j") for m in ("", "_modelled") for item in ("image", "token")):
        out.append("energy")
    if _has(table, "memory_model_bytes"):
        out.append("memory")
    if _has(table, "memory_peak_bytes"):
        out.append("memory_rss")
    out += [o.name for o in (FIDELITY, ACCURACY) if _has(table, o.column)]
    return out + [name for name, (column, *_) in LOADGEN.items() if _has(table, column)]


def senses(objectives: Sequence[Objective]) -> dict[str, str]:
    return {o.column: o.sense for o in objectives}


def intervals(objectives: Sequence[Objective]) -> dict[str, tuple[str, str]]:
    return {o.column: o.interval for o in objectives if o.interval}
