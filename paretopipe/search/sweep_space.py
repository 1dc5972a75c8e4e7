"""A search's space: which of the sweep's settings are its dimensions, and one configuration of it
as the sweep's options.

The split (or, with ``--stages N``, a plan's N - 1 cuts over the blocks ``--splits`` allows);
each of ``--network``, ``--backend``, ``--encrypt`` and ``--transport`` that names several
choices, a language model's prompt lengths, and the testbed's placements (``--placements``: of
``--stages`` hosts, or of every number, each with a plan of its own length); and the settings ``--vary`` names: the codec, an image model's batch size and
in-flight depth, a language model's streams."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .. import engines
from ..analysis.keys import placement_devices
from ..engines import parse_engines
from ..errors import UsageError
from .space import Config, Dimension, Space
from ..transport.runconfig import COMPRESSIONS
from ..wiredtype import AUTO, WIRE_DTYPE_CHOICES
from ..controller.sweep import SweepOptions
from ..controller.sweep.plan import splits_for

#: The sweep lists that become dimensions of the space when they name more than one choice.
LIST_DIMS = (("network", "networks"), ("backend", "backends"), ("cipher", "ciphers"), ("transport", "transports"),
             ("engine", "engines"))


def list_dims(opts: SweepOptions) -> tuple[tuple[str, str], ...]:
    """The sweep lists a search of ``opts`` turns into dimensions (its workload's own too, a
    language model's prompt lengths, and the testbed's placements where --placements names them)."""
    return LIST_DIMS + opts.workload.sweep_lists + ((("placement", "placements"),) if opts.placements else ())


def with_placements_of(opts: SweepOptions, stages: int | None) -> tuple[SweepOptions, int]:
    """A search's placements and its plans' largest number of stages: ``stages`` (--stages) keeps
    the placements of as many hosts; without it, every placement is searched, each with a plan of
    its own number of stages (the plan's cuts a placement of fewer hosts leaves unused are one
    configuration, Space.normalise)."""
    if not opts.placements:
        return opts, stages or 2
    if stages is None:
        return opts, max(len(placement_devices(p)) for p in opts.placements)
    kept = [p for p in opts.placements if len(placement_devices(p)) == stages]
    if not kept:
        raise UsageError(f"--placements {','.join(opts.placements)}: a search of --stages {stages} runs on {stages} "
                         f"hosts; give placements of {stages} hosts, or leave --stages out to search them all")
    return dataclasses.replace(opts, placements=kept), stages


#: The sweep's single settings a search may vary (``--vary NAME=A,B``): each is a column of the
#: configuration key and named in its run files (a batch size other than the first, ``_b4``), so
#: configurations that differ only in it stay apart. A language model's window is its streams,
#: which the key's ``in_flight`` column holds (``_w2``).
VARIABLE = ("codec", "batch_size", "in_flight", "streams")
#: The key column a variable setting is read back from where it is not its own.
COLUMN_OF = {"streams": "in_flight"}


def variables(opts: SweepOptions) -> tuple[str, ...]:
    """The settings a search of ``opts``'s model may vary (:attr:`Workload.variables`)."""
    return opts.workload.variables


def parse_vary(items: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``--vary codec=float32/none,float16/zstd --vary batch_size=1,4 --vary in_flight=1,2`` as {name: choices}."""
    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if name == "engine":  # a sweep list (--engine): ``engine_list`` makes it one
            out[name] = tuple(parse_engines(text, "--vary engine"))
            continue
        if not sep or name not in VARIABLE:
            raise UsageError(f"--vary {item!r}: give NAME=A,B with NAME one of {', '.join(VARIABLE)}, engine (threads "
                             f"are not yet in a run's key: search each count in a session of its own)")
        if name in out:
            raise UsageError(f"--vary {name} given twice: list its choices once, comma-separated")
        values = [v.strip() for v in text.split(",") if v.strip()]
        if not values:
            raise UsageError(f"--vary {name}=: give at least one choice")
        out[name] = tuple(dict.fromkeys(_vary_value(name, v) for v in values))
    return out


def engine_list(opts: SweepOptions, vary: dict[str, tuple[Any, ...]]) -> SweepOptions:
    """``--vary engine=torch,onnxruntime`` as the sweep's engine list, a dimension as --engine's is;
    removed from ``vary``."""
    if "engine" not in vary:
        return opts
    if opts.engines != [engines.TORCH]:
        raise UsageError("--vary engine and --engine name the same dimension: give one of them")
    return dataclasses.replace(opts, engines=list(vary.pop("engine")))


def with_first_choices(opts: SweepOptions, vary: dict[str, tuple[Any, ...]]) -> SweepOptions:
    """``opts`` with each varied setting at its first choice: what the predicted front, and a
    configuration the space does not vary, is measured with."""
    fields: dict[str, Any] = {}
    if vary.get("codec"):
        fields["wire_dtype"], fields["compression"] = vary["codec"][0].split("/")
    for name in ("batch_size", "in_flight", "streams"):
        if vary.get(name):
            fields[name] = vary[name][0]
    return dataclasses.replace(opts, **fields)


def _vary_value(name: str, text: str) -> Any:
    if name in ("batch_size", "in_flight", "streams"):
        if not text.isdigit() or int(text) < 1:
            what = {"batch_size": "a batch size", "in_flight": "an in-flight depth"}.get(name, "a number of streams")
            raise UsageError(f"--vary {name}: {text!r} is not {what}; give whole numbers of at least 1")
        return int(text)
    wire, _, compression = text.partition("/")
    if wire not in WIRE_DTYPE_CHOICES or (compression or "none") not in COMPRESSIONS:
        raise UsageError(f"--vary codec: {text!r} is not WIRE/COMPRESSION; valid wire dtypes: "
                         f"{', '.join(WIRE_DTYPE_CHOICES)}; compressions: {', '.join(COMPRESSIONS)}")
    return f"{wire}/{compression or 'none'}"


def cut_names(stages: int) -> tuple[str, ...]:
    return ("split",) if stages == 2 else tuple(f"cut{j}" for j in range(1, stages))


def search_space(opts: SweepOptions, num_blocks: int, stages: int,
                 vary: dict[str, tuple[Any, ...]] | None = None) -> Space:
    """The space a search explores: the cut positions ``--splits`` allows (every block
    boundary with ``all``; a language model's splits), a plan's cuts for ``stages`` > 2, the sweep
    lists with several choices (a language model's prompt lengths too), and the settings ``vary``
    names with several."""
    if stages < 2:
        raise UsageError(f"--stages {stages}: a split needs at least 2 stages")
    if len(opts.scenarios) > 1:
        raise UsageError(f"--scenario {','.join(opts.scenarios)}: a search measures under one load; give one scenario "
                         f"(its LoadGen figures are objectives: --objectives loadgen_p90,loadgen_samples, ...)")
    if any(c.startswith(f"{AUTO}/") for c in (vary or {}).get("codec", ())) and opts.fidelity_target is None:
        raise UsageError("--vary codec=auto/...: auto chooses each cut's dtype to a target; give --fidelity-target, "
                         "e.g. 0.99")
    splits = splits_for(dataclasses.replace(opts, plans=None), num_blocks)
    positions = tuple(dict.fromkeys(s.blocks[0] for s in splits if len(s.blocks) == 1 and not s.cut))
    if not positions:
        raise UsageError(f"--splits {opts.splits!r}: the search space is empty; give block splits to search, e.g. "
                         f"--splits all or 1-8")
    lengths = {p: len(placement_devices(p)) - 1 for p in opts.placements}
    mixed = len(set(lengths.values())) > 1  # placements of several numbers of hosts: plans of as many
    cuts = cut_names(stages)  # mixed: the largest plan's (stages > 2), which a smaller one uses the first of
    dims = [Dimension(name, positions, ordered=True) for name in cuts]
    for name, field in list_dims(opts):
        choices = tuple(getattr(opts, field))
        if len(choices) > 1:
            dims.append(Dimension(name, choices, ordered=name == "prompt_len"))
    unfit = sorted(set(vary or {}) - set(variables(opts)))
    if unfit:
        raise UsageError(f"--vary {unfit[0]}: {opts.workload.vary_hint}")
    for name, choices in (vary or {}).items():
        if len(choices) > 1:
            dims.append(Dimension(name, tuple(choices), ordered=name != "codec"))
    # A language model's chain runs a block at least on every stage: its plans' cuts differ.
    if mixed:
        return Space(tuple(dims), cuts, length_dim="placement", plan_lengths=tuple(lengths.items()),
                     distinct=opts.workload.distinct_cuts)
    return Space(tuple(dims), cuts if stages > 2 else (), distinct=opts.workload.distinct_cuts and stages > 2)


def base_value(opts: SweepOptions, name: str) -> Any:
    """A variable setting's value in ``opts`` (what a configuration has when the space does not vary
    it): a language model's runs record batch 1 and their streams as the window."""
    if name == "codec":
        return f"{opts.wire_dtype}/{opts.compression}"
    if name == "in_flight":
        return opts.workload.window_of(opts)
    if name == "batch_size" and name not in opts.workload.variables:  # a language model's: one token of each stream
        return 1
    return getattr(opts, name)


def key_value(values: dict[str, Any], opts: SweepOptions, column: str) -> Any:
    """What a configuration of ``values`` has in the key ``column`` (a language model's
    ``in_flight``: its streams)."""
    for name in variables(opts):
        if COLUMN_OF.get(name, name) == column:
            return values.get(name, base_value(opts, name))
    return base_value(opts, column)


def trial_options(opts: SweepOptions, space: Space, config: Config, session: str) -> SweepOptions:
    """The sweep of one configuration, resuming the search's session."""
    values = space.as_dict(config)
    fields: dict[str, Any] = {"session": session, "resume": True, "report": False, "dry_run": False}
    if "split" in values:
        fields.update(splits=str(values["split"]), plans=None)
    else:
        fields.update(plans=[space.plan_of(config)])
    for name, field in list_dims(opts):
        if name in values:
            fields[field] = [values[name]]
    if "codec" in values:
        fields["wire_dtype"], fields["compression"] = values["codec"].split("/")
    # The session's run files name every batch size and in-flight depth but the first (plan.settings_of).
    if "batch_size" in values:
        fields.update(batch_size=int(values["batch_size"]), key_batch_size=space.dim("batch_size").choices[0])
    if "in_flight" in values:
        fields.update(in_flight=int(values["in_flight"]), key_in_flight=space.dim("in_flight").choices[0])
    if "streams" in values:  # a generation's window: its run files name streams but the first (_w2)
        fields.update(streams=int(values["streams"]), key_in_flight=space.dim("streams").choices[0])
    return dataclasses.replace(opts, **fields)


def split_label(space: Space, config: Config) -> str:
    """The configuration's split as summary.csv labels it: ``9``, or a plan's ``3,9``."""
    values = space.as_dict(config)
    return str(values["split"]) if "split" in values else ",".join(map(str, space.plan_of(config)))
