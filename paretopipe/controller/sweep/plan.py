"""What a sweep runs and in what order, from its options and the model's shape alone (no
processes, no clock): the splits, the planned runs of the minimum rounds, one round's runs, the
stretches of runs that share one application of tc, and the plan as the dry run prints it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

from ...analysis.keys import CLOSED_LOOP, DEFAULT_CODEC, DEFAULT_ENGINE, NO_FAULT, NO_PLACEMENT, config_key, run_key
from ...errors import UsageError
from ...splitspec import Split, parse_splits, split_adaptive, split_cuts
from . import rounds
from .group import GroupPass, GroupProgress
from .options import SweepOptions
from .placements import pass_options


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: a configuration (model, backend, network, split) and its repetition."""

    model: str
    backend: str
    network: str
    split: Split
    run: int
    reference: bool = False  # a drift check's re-measurement of the reference configuration
    cipher: str = "none"     # the TCP data port's --encrypt choice (transport.aead)
    transport: str = "tcp"   # the data port's --transport (transport.messaging)
    codec: str = DEFAULT_CODEC  # --wire-dtype/--compression (settings_of)
    batch_tag: int | None = None  # the batch size, where the run file names it (settings_of)
    in_flight_tag: int | None = None  # the in-flight depth, where the run file names it
    scenario: str = CLOSED_LOOP  # a LoadGen scenario (paretopipe.loadgen), or the closed loop
    prompt_len: int | None = None  # a language model's prompt tokens per stream (None: image batches)
    fault: str = NO_FAULT  # the fault the run survives (paretopipe.faults), or none
    placement: str = NO_PLACEMENT  # the hosts it runs on, in order (--placements), or the first ones
    engine: str = DEFAULT_ENGINE   # the engine its stages compute on (paretopipe.engines label)

    @property
    def wire_dtype(self) -> str:
        """The dtype its codec sends a cut's tensors in (the pass's, of --wire-dtype's list)."""
        return self.codec.split("/")[0]

    @property
    def split_index(self) -> int | str:
        return self.split.label

    @property
    def stages(self) -> int:
        return self.split.stages

    @property
    def config_key(self) -> str:
        return config_key(self.model, self.backend, self.network, self.split, self.cipher, self.transport,
                          self.codec, self.batch_tag, self.in_flight_tag, self.scenario, self.prompt_len, self.fault,
                          self.placement, self.engine)

    @property
    def run_key(self) -> str:
        return f"{self.config_key}_ref{self.run}" if self.reference else run_key(self.config_key, self.run)


def settings_of(opts: SweepOptions, group: GroupPass | None = None) -> dict[str, Any]:
    """The sweep-wide settings a configuration's key carries (PlannedRun's ``codec``), its batch
    size and in-flight depth where a search session holds several (``key_batch_size`` and
    ``key_in_flight``: the ones its file names leave out), and the pass's LoadGen ``scenario`` and
    prompt length, fault, placement and engine."""
    def tag(value: int, base: int | None) -> int | None:
        return value if base is not None and value != base else None

    dtype = (group.wire_dtype if group else None) or opts.wire_dtype
    window = opts.workload.window_of(opts)  # the key's in_flight
    return {"codec": f"{dtype}/{opts.compression}", "batch_tag": tag(opts.batch_size, opts.key_batch_size),
            "in_flight_tag": tag(window, opts.key_in_flight),
            "scenario": group.scenario if group else CLOSED_LOOP, "prompt_len": group.prompt_len if group else None,
            "fault": group.fault if group else NO_FAULT,
            "placement": (group.placement if group else None) or NO_PLACEMENT,
            "engine": (group.engine if group else None) or opts.engines[0]}


def worker_groups(opts: SweepOptions) -> list[GroupPass]:
    """The passes of each model's worker groups: the TCP backend once per transport and cipher (a
    transport and a cipher are agreed per connection), each once per LoadGen scenario (the closed
    loop when none is asked for), for a language model once per prompt length, once per fault
    (--fault; none when it is not given), once per wire dtype where --wire-dtype lists several,
    once per engine where --engine lists several (the same processes: a stage takes its engine
    from the run), and once per placement of --placements (its hosts are the group's)."""
    own = {key: getattr(opts, option) for key, option in opts.workload.sweep_lists}  # a generation's prompt lengths
    prompts = own.get("prompt_len", [None])
    dtypes = opts.dtypes if len(opts.dtypes) > 1 else [None]
    labels = opts.engines if len(opts.engines) > 1 else [None]
    return [GroupPass(backend, cipher, transport, scenario, prompt, fault, dtype, placement, engine)
            for placement in (opts.placements or [None]) for backend in opts.backends
            for transport in (opts.transports if backend == "tcp" else ["tcp"])
            for cipher in (opts.ciphers if backend == "tcp" else ["none"])
            for scenario in opts.scenarios for prompt in prompts for fault in opts.faults for dtype in dtypes
            for engine in labels]


def splits_for(opts: SweepOptions, num_blocks: int, fine_cuts: dict[str, list[int]] | None = None) -> list[Split]:
    """The static splits (or plans), then the fine cuts (named in --splits, or every cut of 2 to
    --max-live tensors with ``all``), then ``adaptive`` when --splits names it. ``fine_cuts``:
    the model's (:func:`paretopipe.partition.tables.fine_cut_table`); without it no cut is planned."""
    if opts.plans:
        bad = [p for p in opts.plans if max(p) > num_blocks]
        if bad:
            raise UsageError(f"--split-blocks plan {','.join(map(str, bad[0]))}: block indices go up to {num_blocks}")
        return [Split(tuple(p), plan=True) for p in opts.plans]
    static, policies = split_adaptive(opts.splits)
    static, named = split_cuts(static)
    blocks = [Split((k,)) for k in parse_splits(static, num_blocks)] if static else []
    return blocks + _cut_splits(opts.max_live, named, fine_cuts, static.strip().lower() == "all") + \
        [Split(adaptive=True, policy=p) for p in policies]


def _cut_splits(limit: int, named: list[str], fine_cuts: dict[str, list[int]] | None, every: bool) -> list[Split]:
    if fine_cuts is None:
        return []
    for name in named:
        if name not in fine_cuts:
            raise UsageError(f"--splits: {name!r} is not a cut of this model (python -m paretopipe.split "
                             f"--list --fine lists them)")
        if fine_cuts[name][0] > limit:
            raise UsageError(f"--splits: {fine_cuts[name][0]} tensors cross {name}; add --max-live "
                             f"{fine_cuts[name][0]}")
    wide = [n for n, (width, _) in fine_cuts.items() if 2 <= width <= limit] if every else []
    return [Split(cut=n) for n in dict.fromkeys(named + wide)]


def plan_runs(opts: SweepOptions, num_blocks: dict[str, int],
              fine_cuts: dict[str, dict[str, list[int]]] | None = None) -> list[PlannedRun]:
    """The runs of the minimum rounds (--runs), in the order they will run; --precision and drift
    checks may add more."""
    planned = []
    for model in opts.models:
        for group in worker_groups(opts):
            configs = [(n, k) for n in opts.networks
                       for k in splits_for(pass_options(opts, group.placement), num_blocks[model],
                                           (fine_cuts or {}).get(model))]
            run = functools.partial(PlannedRun, model, group.backend, cipher=group.cipher, transport=group.transport,
                                    **settings_of(opts, group))
            if opts.order == "sequential":
                planned += [run(n, k, r) for n, k in configs for r in range(opts.runs)]
                continue
            for r in range(opts.runs):
                planned += [run(n, k, r) for n, k in
                            rounds.round_order(configs, opts.seed, group.name(model), r, opts.link == "tc")]
    return planned


def round_plan(opts: SweepOptions, model: str, backend: str, group: GroupProgress, active: list[tuple],
               r: int) -> list[PlannedRun]:
    """Round ``r``'s runs: in random order, each active configuration's next run after the runs
    drift set aside; sequentially, every run of a configuration back to back. Takes the set-aside
    runs it plans out of ``group.rerun``."""
    cipher, transport, settings = group.cipher, group.transport, settings_of(opts, group.group_pass)
    if opts.order == "sequential":
        return [PlannedRun(model, backend, n, k, i, cipher=cipher, transport=transport, **settings) for n, k in active
                for i in range(group.max_runs if opts.precision else opts.runs)]
    plan = [PlannedRun(model, backend, n, k, i, cipher=cipher, transport=transport, **settings) for n, k in
            rounds.round_order(active, opts.seed, group.name, r, opts.link == "tc")
            for i in group.rerun[(n, k)] + [r]]
    for c in active:
        group.rerun[c] = []
    return plan


def segments(plan: list[PlannedRun], tc_mode: bool) -> list[tuple[str | None, list[PlannedRun]]]:
    """With tc, consecutive runs of one network share one application of its qdiscs."""
    if not tc_mode:
        return [(None, plan)]
    out: list[tuple[str | None, list[PlannedRun]]] = []
    for one in plan:
        if out and out[-1][0] == one.network:
            out[-1][1].append(one)
        else:
            out.append((one.network, [one]))
    return out


#: How the plan's line names a workload's own sweep list (Workload.sweep_lists).
_LIST_WORDS = {"prompt_lens": "prompts"}


def describe_plan(planned: Sequence[PlannedRun], opts: SweepOptions) -> str:
    per = opts.warmup + opts.num_batches
    where = ("locally" if not opts.testbed.remote else
             "on " + ", ".join(f"{h.address} ({h.device})" for h in opts.testbed.hosts))
    ciphers = f" x ciphers {', '.join(opts.ciphers)} (tcp)" if opts.ciphers != ["none"] else ""
    transports = f" x transports {', '.join(opts.transports)} (tcp)" if opts.transports != ["tcp"] else ""
    scenarios = f" x LoadGen scenarios {', '.join(opts.scenarios)}" if opts.scenarios != [CLOSED_LOOP] else ""
    if len(opts.dtypes) > 1:
        scenarios += f" x wire dtypes {', '.join(opts.dtypes)}"
    if opts.faults != [NO_FAULT]:
        scenarios += f" x faults {', '.join(opts.faults)} (deadline {opts.deadline_s * 1e3:g} ms)"
    if opts.engines != [DEFAULT_ENGINE]:
        scenarios += f" x engines {', '.join(opts.engines)}"
    if opts.placements:
        scenarios += f" x placements {', '.join(opts.placements)} (hosts by their place in HOSTS)"
    work = opts.workload.work.format(o=opts, per=per, prompts="/".join(map(str, opts.prompt_lens)))
    own = "".join(f"{_LIST_WORDS.get(option, option)} {', '.join(map(str, getattr(opts, option)))} x "
                  for _, option in opts.workload.sweep_lists)
    lines = [f"{len(planned)} runs {where}: models {', '.join(opts.models)} x backends {', '.join(opts.backends)}"
             f"{transports}{ciphers}{scenarios} x "
             f"networks {', '.join(opts.networks)} x splits ({opts.splits if not opts.plans else 'plans'}) x "
             + f"{own}{opts.runs} runs; {work}"
             + (")" if opts.warmup_every_run or not opts.warmup else ", on a cut's first run in each worker group)"),
             f"order: {opts.order}" + (f" (seed {opts.seed}), one round per run" if opts.order == "random" else "")
             + (f"; --precision {opts.precision:.0%}: up to {opts.max_runs or 3 * opts.runs} runs per configuration"
                if opts.precision else "")]
    lines += [f"  {p.run_key}" for p in planned[:10]]
    if len(planned) > 10:
        lines.append(f"  ... and {len(planned) - 10} more")
    return "\n".join(lines)
