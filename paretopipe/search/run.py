"""``paretopipe search``: a multi-objective search whose every trial is a configuration measured by
the sweep's own machinery into one ordinary session folder, so ``report``, ``compare``, the
notebook and the live page read it as any sweep's.

The space is the sweep's lists: the split (or, with ``--stages N``, the N - 1 cuts of a plan over
the block positions ``--splits`` allows), and each of ``--network``, ``--backend``, ``--encrypt``
and ``--transport`` that names more than one choice. A trial runs the sweeper on that one
configuration (its rounds, ``--precision``, drift checks and infeasibility rules), resuming the
search's session, and reads the configuration's objectives (``--objectives``) from summary.csv: a
configuration that is infeasible or fails is kept as such and is never on the front.
``search.json`` in the session says, after every trial, what was measured, in which order, from
where (``prediction``, ``sampler`` or ``fill``) and with what result."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from .. import records
from ..analysis import objectives as objective_names
from ..analysis.session import Session, sweep_session_dir
from ..errors import ParetoPipeError, UsageError
from ..llm.families import family_of
from ..llm.shapes import shape_of
from ..predict.costmodel import LinkModel, chain_terms
from ..predict import lm_costmodel
from ..predict.device_profile import DeviceProfile, codec_key
from . import loop
from .space import Config, Space
from .study import GRACE_S, StudySpec, check_url, identity as study_identity, redacted
from ..wiredtype import AUTO
from ..controller.sweep import SweepOptions, Sweeper
from .sweep_space import (base_value, cut_names, key_value, list_dims, search_space, split_label, trial_options,
                           variables)

log = logging.getLogger("paretopipe.search")
FILE_NAME = "search.json"
#: Study attributes: the configuration every testbed measures, and ``REFERENCE_OF + testbed`` its result there.
REFERENCE, REFERENCE_OF = "reference", "reference/"
#: How long a worker that joined a study waits for its maker to name the reference configuration.
REFERENCE_WAIT_S = 30.0
@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """What a search adds to the sweep's options."""

    budget: int
    sampler: str = loop.DEFAULT_SAMPLER
    stages: int = 2
    startup: int = 10
    predicted: tuple[dict[str, Any], ...] = ()  # the predicted configurations measured first (predicted_first)
    vary: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)  # parse_vary
    study_url: str | None = None   # --study: share the study through this storage
    study_name: str | None = None  # default: paretopipe-<model>
    testbed: str | None = None     # default: the testbed's own label (Testbed.label)
    study_grace_s: float | None = None  # default: study.GRACE_S


def model_name(model: str, opts: SweepOptions) -> str:
    """The model as its records name it (a language model by its shape's name)."""
    return family_of(model, opts.model_dir).record_name(model, opts.model_dir)


def objective_values(summary: pd.DataFrame, opts: SweepOptions, space: Space, config: Config, model: str
                     ) -> tuple[tuple[float, ...] | None, str]:
    """The configuration's objectives from summary.csv, and its status (``complete``,
    ``infeasible``, or ``failed`` when no row holds it)."""
    values = space.as_dict(config)
    rows = summary[(summary["model"] == model_name(model, opts)) & (summary["split_index"].astype(str)
                                                                   == split_label(space, config))]
    for name, field in list_dims(opts):
        wanted = values.get(name, getattr(opts, field)[0])
        if name in summary.columns and not (name == "cipher" and wanted == "auto"):
            rows = rows[rows[name].astype(str) == str(wanted)]
    for column in ("codec", "batch_size", "in_flight"):
        if column in summary.columns:
            rows = rows[rows[column].astype(str) == str(key_value(values, opts, column))]
    if "scenario" in summary.columns:
        rows = rows[rows["scenario"].astype(str) == opts.scenarios[0]]
    if rows.empty:
        return None, "failed"
    row = rows.iloc[0]
    if row.get("status") != "complete":
        return None, str(row.get("status"))
    chosen = objective_names.parse(opts.objectives, summary)
    try:
        return tuple(float(row[o.column]) for o in chosen), "complete"
    except (TypeError, ValueError):
        return None, "failed"


class SearchRun:
    """One search of one model: its session, its space, and the trials measured so far."""

    def __init__(self, opts: SweepOptions, search: SearchOptions, num_blocks: int) -> None:
        if len(opts.models) != 1:
            raise UsageError(f"--models {','.join(opts.models)}: a search explores one model's space; run one "
                             f"search per model")
        self.opts, self.search = opts, search
        self.model = opts.models[0]
        self.space = search_space(opts, num_blocks, search.stages, search.vary)
        self.dir = sweep_session_dir(opts.out, opts.session, opts.resume)
        self.session = self.dir.name
        self.trials: list[dict[str, Any]] = []
        self.started = time.monotonic()
        chosen = objective_names.check_names(opts.objectives) or ",".join(
            opts.workload.default_objectives)
        self.objective_names = [n.strip() for n in chosen.split(",")]
        self.seeds = self.predicted_configs()
        self.testbed = search.testbed or opts.testbed.label()
        self.reference: dict[str, Any] | None = None
        self._study: Any = None
        self.sweeper: Sweeper | None = None  # the trials' one sweeper (its worker group kept warm)
        self.study: StudySpec | None = None
        if search.study_url:
            senses = {n: objective_names.sense(n) for n in self.objective_names}
            name = model_name(self.model, self.opts)
            ident = study_identity(name, senses, {d.name: d.choices for d in self.space.dims})
            ident["settings"] = {"stages": search.stages,
                                 **{n: base_value(opts, n) for n in variables(opts) if n not in self.space.names}}
            grace = search.study_grace_s or GRACE_S
            self.study = StudySpec(check_url(search.study_url),
                                   search.study_name or f"paretopipe-{name}", self.testbed, ident,
                                   heartbeat_s=max(1.0, grace / 3), grace_s=grace)

    def predicted_configs(self) -> list[Config]:
        out = []
        for values in self.search.predicted:
            full = {**{n: getattr(self.opts, f)[0] for n, f in list_dims(self.opts)},
                    **{n: (self.search.vary.get(n) or (base_value(self.opts, n),))[0] for n in variables(self.opts)},
                    **values}
            missing = [d.name for d in self.space.dims if d.name not in full]
            if missing:
                raise UsageError(f"a predicted configuration names no {missing[0]}: {values}")
            bad = [d.name for d in self.space.dims if full[d.name] not in d.choices]
            if bad:
                raise UsageError(f"a predicted configuration's {bad[0]} {full[bad[0]]!r} is outside the search space")
            out.append(self.space.normalise(full))
        return out

    def reference_config(self) -> Config:
        """The configuration every testbed of a shared study measures: the predicted front's first,
        else the middle of each ordered dimension with the first choice of the others (the space's
        first configuration where that plan's cuts coincide and must not)."""
        if self.seeds:
            return self.seeds[0]
        middle = self.space.normalise({d.name: d.choices[len(d.choices) // 2] if d.ordered else d.choices[0]
                                       for d in self.space.dims})
        return middle if self.space.valid(middle) else next(self.space.configs())

    def join(self, study: Any, created: bool) -> None:
        """Measure the study's reference configuration on this testbed (outside the budget: it
        compares testbeds) and record it in the study."""
        if created:
            study.set_user_attr(REFERENCE, self.space.as_dict(self.reference_config()))
        deadline = time.monotonic() + REFERENCE_WAIT_S
        while (named := study.user_attrs.get(REFERENCE)) is None and time.monotonic() < deadline:
            time.sleep(0.5)   # the study's maker names it right after making it
        config = self.space.normalise(named) if named is not None else self.reference_config()
        values = self.measure(config)
        self.trials[-1]["origin"] = "reference"
        study.set_user_attr(REFERENCE_OF + self.testbed, {"values": list(values) if values is not None else None,
                                                          "at": time.time()})
        self._study = study
        self.reference = reference_offsets(study.user_attrs, self.objective_names)
        self.write()

    def measure(self, config: Config) -> tuple[float, ...] | None:
        """One trial: the configuration swept into the session on the search's one sweeper, whose
        warm workers the next trial keeps where it runs on the same worker group."""
        started = time.monotonic()
        try:
            options = trial_options(self.opts, self.space, config, self.session)
            if self.sweeper is None:
                self.sweeper = Sweeper(options)
            else:
                self.sweeper.retarget(options)
            self.sweeper.run(keep_group=True)
            summary = Session(self.dir).configs()
            values, status = objective_values(summary, self.opts, self.space, config, self.model)
        except UsageError:
            raise
        except (ParetoPipeError, OSError) as exc:
            log.error("configuration %s: %s", self.space.as_dict(config), exc)
            values, status = None, "failed"
        self.trials.append({"config": self.space.as_dict(config), "status": status, "values": values,
                            "testbed": self.testbed, "seconds": round(time.monotonic() - started, 3)})
        return values

    def _record(self, trial: loop.Trial) -> None:
        self.trials[-1]["origin"] = trial.origin
        self.write()

    def write(self, done: bool = False) -> Path:
        # The folder appears with the first trial (the sweep makes it), so a search that
        # loop.search refuses (a budget below the predicted front) leaves none behind.
        self.dir.mkdir(parents=True, exist_ok=True)
        return records.atomic_write_json(self.dir / FILE_NAME, {
            "model": model_name(self.model, self.opts), "sampler": self.search.sampler, "seed": self.opts.seed,
            "budget": self.search.budget, "stages": self.search.stages, "objectives": self.objective_names,
            "space": {d.name: list(d.choices) for d in self.space.dims}, "space_size": self.space.size(),
            "predicted": len(self.search.predicted), "testbed": self.testbed,
            "study": {"url": redacted(self.study.url), "name": self.study.name} if self.study else None,
            "reference": self.reference,
            "complete": done, "worker_groups_started": self.sweeper.groups_started if self.sweeper else 0,
            "wall_s": round(time.monotonic() - self.started, 3), "trials": self.trials})

    def run(self) -> loop.SearchResult:
        senses = {n: objective_names.sense(n) for n in self.objective_names}
        try:
            result = loop.search(self.space, self.measure, senses, self.search.budget, self.search.sampler,
                                 seed=self.opts.seed or 0, seeds=self.seeds,
                                 startup=self.search.startup, on_trial=self._record, shared=self.study,
                                 on_join=self.join)
        finally:
            if self.sweeper is not None:
                self.sweeper.close()
        if self.reference is not None:   # the testbeds that joined since
            self.reference = reference_offsets(self._study.user_attrs, self.objective_names)
        self.write(done=True)
        return result


def reference_offsets(attrs: dict[str, Any], objectives: Sequence[str]) -> dict[str, Any] | None:
    """The study's reference configuration as each testbed measured it, and each testbed's
    offset from the first to measure it: per objective, its value over the first's."""
    measured = {k[len(REFERENCE_OF):]: v for k, v in attrs.items() if k.startswith(REFERENCE_OF)}
    if not measured:
        return None
    order = sorted(measured, key=lambda tb: measured[tb].get("at", 0.0))
    base = measured[order[0]].get("values")
    offsets = {}
    for tb in order:
        values = measured[tb].get("values")
        offsets[tb] = ({n: round(v / b, 4) for n, v, b in zip(objectives, values, base) if b}
                       if values is not None and base is not None else None)
    return {"config": attrs.get(REFERENCE), "baseline": order[0],
            "testbeds": {tb: measured[tb].get("values") for tb in order}, "offsets": offsets}


def predicted_first(profile_specs: Sequence[str], opts: SweepOptions, space: Space, stages: int, budget: int
                    ) -> tuple[dict[str, Any], ...]:
    """The configurations a search measures first: every plan of the space's cut positions priced
    by the cost model under each network of the space (one device profile per stage, every hop
    under the network's conditions, as a local sweep emulates it), in layers of non-dominated
    sorting per network, up to :data:`loop.PREDICTED_SHARE` of ``budget`` (the whole predicted
    front at least). A network that follows a rate trace has no constant-rate prediction and adds
    none."""
    if len(profile_specs) != stages:
        raise UsageError(f"--device-profiles: give one profile per stage ({stages}), got {len(profile_specs)}")
    profiles = [DeviceProfile.load_spec(spec) for spec in profile_specs]
    blocks = {int(k): int(v) for k, v in profiles[0].doc["blocks"].items()}
    cuts = cut_names(stages)
    splits = [k for k in space.dim(cuts[0]).choices if k in blocks]
    networks = space.dim("network").choices if "network" in space.names else tuple(opts.networks[:1])
    # auto's dtype is chosen by each run: the prediction prices its upper bound, float32.
    codec = codec_key("float32" if opts.wire_dtype == AUTO else opts.wire_dtype, opts.compression)
    configs, values, groups = [], [], []
    for name in networks:
        try:
            up, down = LinkModel.pair(opts.conditions(name))
        except UsageError as exc:
            log.warning("no predicted front for %s: %s", name, exc)
            continue
        for plan in itertools.combinations_with_replacement(splits, stages - 1):
            terms = chain_terms(profiles, [up] * (stages - 1), [blocks[k] for k in plan], opts.batch_size, codec,
                                [down] * (stages - 1))
            config = dict(zip(cuts, plan))
            configs.append({**config, "network": name} if "network" in space.names else config)
            values.append((terms.latency_s(), terms.throughput_imgs_per_s()))
            groups.append(name)
    return tuple(loop.predicted_first(configs, values, ["min", "max"], budget, groups))


def predicted_first_generation(profile_specs: Sequence[str], opts: SweepOptions, space: Space, budget: int
                               ) -> tuple[dict[str, Any], ...]:
    """A language model's configurations measured first: every split of the space under each of
    its networks, prompt lengths and wire dtypes, priced by the cost model (time to first token
    and per token, from a device profile per stage: :mod:`paretopipe.predict.lm_costmodel`), in
    layers of non-dominated sorting per network and prompt length, up to
    :data:`loop.PREDICTED_SHARE` of ``budget``."""
    if len(profile_specs) != 2 or len(space.plan) > 0:
        raise UsageError("--device-profiles: a language model's prediction is of two devices: give two profiles "
                         "and two stages")
    profiles = [lm_costmodel.load_profile(spec) for spec in profile_specs]
    shape = shape_of(opts.models[0], opts.model_dir)
    dims = {d.name: d.choices for d in space.dims}
    codecs = dims.get("codec", (base_value(opts, "codec"),))
    configs, values, groups = [], [], []
    for name in dims.get("network", tuple(opts.networks[:1])):
        conditions = opts.conditions(name)
        for prompt in dims.get("prompt_len", tuple(opts.prompt_lens[:1])):
            for codec in codecs:
                rows = lm_costmodel.predict(shape, profiles, conditions, prompt, codec.split("/")[0])
                for row in (r for r in rows if r["split"] in dims["split"]):
                    config = {"split": row["split"], "network": name, "prompt_len": prompt, "codec": codec}
                    configs.append({k: v for k, v in config.items() if k in dims})
                    values.append((row["predicted_ttft_s"], row["predicted_tpot_s"]))
                    groups.append((name, prompt))
    return tuple(loop.predicted_first(configs, values, ["min", "min"], budget, groups))


def describe(result: loop.SearchResult, run: SearchRun) -> Sequence[str]:
    """The lines a search ends with: what it measured, and its front."""
    feasible = [t for t in result.trials if t.values is not None]
    lines = [f"search: {len(result.trials)} of {run.space.size()} configurations measured "
             f"({sum(t.origin == 'prediction' for t in result.trials)} predicted, {len(feasible)} feasible), "
             f"sampler {result.sampler}, session {run.dir}"]
    if run.study is not None:
        lines[0] = lines[0].replace("search: ", f"search on testbed {run.testbed}: ", 1)
        ref = run.reference or {}
        for tb, offsets in (ref.get("offsets") or {}).items():
            values = ref["testbeds"].get(tb)
            lines.append(f"  reference {ref.get('config')} on {tb}: "
                         + (", ".join(f"{n} {v:.4g}" for n, v in zip(result.objectives, values)) if values else "failed")
                         + (f" (x{', x'.join(f'{r:.3f} {n}' for n, r in offsets.items())} of {ref['baseline']}'s)"
                            if offsets and tb != ref["baseline"] else ""))
        lines.append(f"  study {run.study.name} ({redacted(run.study.url)}): {result.study_measured} configurations "
                     f"measured by all its workers; this worker's front:")
    # A front per network, as the report draws them: configurations under different conditions
    # do not dominate each other.
    by_network: dict[Any, list[loop.Trial]] = {}
    for t in feasible:
        by_network.setdefault(run.space.as_dict(t.config).get("network"), []).append(t)
    for trials in by_network.values():
        points = [t.values for t in trials]
        mask = loop.pareto.front_mask(points, list(result.objectives.values()))
        for t, on in zip(trials, mask):
            if on:
                lines.append(f"  on the front: {run.space.as_dict(t.config)} -> "
                             + ", ".join(f"{n} {v:.4g}" for n, v in zip(result.objectives, t.values)))
    return lines
