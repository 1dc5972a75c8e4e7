"""What a run computes, as one value: image batches, or a language model's generation (issue 68).

The kind used to be asked five ways (a configuration's ``generation is not None``, a model's
``is_language_model``, an options object's ``language_model``, whether a table had a time-per-token
column). A :class:`Workload` answers what those branches wanted: the item a rate, an energy or a
cost is per, a table's default objectives, and its name (each objective's column, by
workload, is :data:`paretopipe.analysis.objectives.BY_WORKLOAD`). A run record says
it by its configuration (a generation's settings, or none); every runs.csv and summary.csv row
carries its name as ``workload``, so a table read back from disk knows its workload from what its
runs said, not from which columns happen to exist.
No torch and no pandas at import: the base layer, below everything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .errors import UsageError

#: The field a record, a runs.csv row and a summary.csv row carry.
FIELD = "workload"


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str                           # a record's and a table's ``workload`` value
    item: str                           # what a rate, an energy per item and a cost per item count
    generates: bool                     # a language model generating tokens
    default_objectives: tuple[str, str]  # a table's fronts unless ``--objectives`` names others
    #: The sweep option that is a configuration key's ``in_flight`` (a generation's window is its streams).
    window: str
    #: The sweep option that is a configuration key's batch size, or None where a step is one item
    #: of each stream (a generation's: one token).
    batch: str | None
    #: A sweep's runs, in words, as a template of the sweep options ``o``, the batches a run sends
    #: ``per`` and the prompt lengths ``prompts`` (:func:`paretopipe.controller.sweep.plan.describe_plan`).
    work: str
    #: The sweep's settings a search may vary (``--vary``): a generation's steps are one token of
    #: each stream, so its batch is 1 and its window the streams.
    variables: tuple[str, ...]
    #: Sweep lists of this workload's own that are passes of a sweep and dimensions of a search
    #: (a generation's prompt lengths), as (key column, option).
    sweep_lists: tuple[tuple[str, str], ...]
    #: Whether a plan's cuts must differ (a language model's chain runs a block at least on every stage).
    distinct_cuts: bool
    #: What ``--vary`` of a setting this workload does not have is told to vary instead.
    vary_hint: str
    #: What a panel's default front and its curves are drawn on, in words.
    drawn_on: str
    #: What a panel's time breakdown has a bar for.
    breakdown_unit: str
    #: A panel's figures beyond those every workload has (a generation's tokens/s against memory).
    figures: tuple[str, ...]
    #: What the sweep's closing front table's columns are, in words.
    front_units: str
    #: The dataset every run reads, or None where ``--dataset`` names it (a generation's prompts
    #: are seeded token ids: its dataset is always synthetic).
    dataset: str | None = None
    #: What a stage of this workload imports on its way to its first run beyond an image stage's
    #: (``zygote.PRELOAD``): a sweep's zygote imports it once, before it forks the stages. A
    #: language model's stage imported transformers and its Llama code itself: 1.4 s of CPU a stage
    #: here, again in every stage a sweep starts.
    preload: tuple[str, ...] = ()
    #: The settings this workload does not take, each with why (:meth:`refusal`).
    refusals: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def __str__(self) -> str:
        return self.name

    def batch_of(self, opts: Any) -> int:
        """The batch size a configuration of the sweep ``opts`` is keyed by."""
        return getattr(opts, self.batch) if self.batch else 1

    def window_of(self, opts: Any) -> int:
        """The window (a key's ``in_flight``) a configuration of the sweep ``opts`` is keyed by."""
        return getattr(opts, self.window)

    def refusal(self, setting: str) -> str | None:
        """Why this workload does not take ``setting`` (a key of :data:`SETTINGS`), or None when
        it does: the sweep's checks and ``RunConfig``'s ask this, not which kind they have."""
        if setting not in SETTINGS:
            raise KeyError(f"no workload setting {setting!r}: valid {', '.join(SETTINGS)}")
        return self.refusals.get(setting)

    def refuse(self, **given: Any) -> None:
        """Refuse, in one line (:meth:`refusal`), the first setting in ``given`` that a sweep or a
        run has (a true value: ``refuse(eval_text=cfg.eval_text)``) and this workload does not take."""
        for setting, value in given.items():
            why = self.refusal(setting)
            if value and why:
                raise UsageError(why)


#: The settings only one workload takes, which the other's :meth:`Workload.refusal` explains.
SETTINGS = ("token_bounds", "eval_text", "llamacpp", "rpc_wire_dtype", "engines", "adaptive")


IMAGES = Workload("images", "image", False, ("latency", "throughput"), window="in_flight", batch="batch_size",
                  work="{per} batches of {o.batch_size} each ({o.warmup} warm-up",
                  variables=("codec", "batch_size", "in_flight"), sweep_lists=(), distinct_cuts=False,
                  vary_hint="streams are a language model's; an image model's window is --vary in_flight",
                  drawn_on="latency and throughput", breakdown_unit="split", figures=(),
                  front_units="latency_s: median per batch; throughput in images/s",
                  refusals={"token_bounds": "--ttft-ms and --tpot-ms bound a language model's tokens; an image model's "
                                            "Server takes --latency-bound-ms",
                            "eval_text": "--eval-text is a language model's evaluation text; for an image "
                                         "model's, use --eval-samples of its --dataset",
                            "llamacpp": "it runs a language model given as a GGUF (--model-dir FILE.gguf or a named "
                                        "real model), not image batches",
                            "rpc_wire_dtype": "an image model's activations cross as computed (float32); use "
                                              "--backend tcp"})
GENERATION = Workload("generation", "token", True, ("ttft", "tpot"), window="streams", batch=None,
                      work="{o.streams} stream(s) of {o.gen_tokens} tokens after a prompt of {prompts} tokens each "
                           "({o.warmup} warm-up generation(s)",
                      variables=("codec", "streams"),
                      sweep_lists=(("prompt_len", "prompt_lens"),), distinct_cuts=True,
                      vary_hint="a language model's steps are one token of each stream; its window is its streams: "
                                "--vary streams=1,2,4",
                      drawn_on="time to first token and per token", breakdown_unit="step", figures=("tokens_memory",),
                      front_units="time to first token and per token: medians, s; throughput in tokens/s",
                      dataset="synthetic",
                      preload=("transformers.models.auto.modeling_auto", "transformers.cache_utils",
                               "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2"),
                      refusals={"engines": "a language model's stages run on torch or as llama.cpp (--engine llamacpp)",
                                "adaptive": "a language model runs static splits over its prompts: drop adaptive "
                                            "from --splits"})
BY_NAME = {w.name: w for w in (IMAGES, GENERATION)}


def named(name: str) -> Workload:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown workload {name!r}: valid {', '.join(BY_NAME)}") from None


def of_generation(generation: Any) -> Workload:
    """A configuration's workload from its generation settings (None: image batches)."""
    return IMAGES if generation is None else GENERATION


def of_record(record: Mapping[str, Any]) -> Workload:
    """A run record's, from its configuration's generation settings."""
    return of_generation((record.get("config") or {}).get("generation") or None)


def of_table(table: Any) -> Workload:
    """A runs.csv or summary.csv table's (a pandas DataFrame): its rows' ``workload``. A table with
    no such column is from before the rows carried it (or built by hand): a generation's has a time
    per output token, the one place that is still read from a column's presence."""
    if FIELD in getattr(table, "columns", ()):
        names = {str(v) for v in table[FIELD].dropna().unique()}
        if len(names) > 1:
            raise UsageError(f"this table mixes workloads ({', '.join(sorted(names))}): report each session alone")
        if names:
            return named(names.pop())
    column = "tpot_median_s"
    if column in getattr(table, "columns", ()):
        import pandas as pd  # only for a table, which is pandas already

        return GENERATION if pd.to_numeric(table[column], errors="coerce").notna().any() else IMAGES
    return IMAGES
