"""One planned run's typed configuration, built once here from the sweep's options, the group's
report and what the group has measured so far; the record's ``config`` is exactly this."""

from __future__ import annotations

from typing import Any, Sequence

from ... import faults
from ...analysis.keys import CLOSED_LOOP, NO_FAULT, NO_PLACEMENT
from ...loadgen.settings import LoadgenOptions
from ...network import deadlines
from ...network.conditions import NetworkConditions
from ...transport.runconfig import AdaptiveOptions, Generation, RpcOptions, RunConfig, eval_samples_for
from .group import GroupInfo
from .options import SweepOptions
from .plan import PlannedRun, splits_for


def run_config(opts: SweepOptions, info: GroupInfo, planned: PlannedRun, *, warmed: bool, timeout_s: float
               ) -> RunConfig:
    """``warmed``: this group has run these cuts already, so the run skips its warm-up (unless
    --warmup-every-run); ``timeout_s``: the run's deadline (:func:`timeout_s`)."""
    o = opts
    adaptive = planned.split.adaptive
    cuts = run_cuts(info, planned)
    rpc = planned.backend == "rpc"
    # The adaptive run chooses among the sweep's two-stage splits: block splits, and cuts by name.
    static = [k.blocks[0] if k.blocks else k.cut for k in splits_for(o, info.num_blocks, info.fine_cuts)
              if not (k.adaptive or k.plan)]
    candidates = static if len(static) > 1 else None
    extra: dict[str, Any] = {"adaptive_split": AdaptiveOptions(objective=o.objective, candidates=candidates)} \
        if adaptive else {}
    if not rpc:
        extra["deadline_s"] = o.deadline_s
    if planned.scenario != CLOSED_LOOP:
        extra["loadgen"] = LoadgenOptions.of_flags(planned.scenario, **o.loadgen_settings)
    if planned.fault != NO_FAULT:
        extra["fault"] = faults.parse_fault(planned.fault)
    if planned.placement != NO_PLACEMENT:
        extra["placement"] = planned.placement
    # A LoadGen run always warms up: its warm-up sizes LoadGen's expectations.
    skip_warmup = not adaptive and not o.warmup_every_run and warmed and planned.scenario == CLOSED_LOOP
    if planned.prompt_len is not None:  # a language model's generation: its steps are the run's batches
        extra["generation"] = Generation(gen_tokens=o.gen_tokens, streams=o.streams, prompt_len=planned.prompt_len,
                                         temperature=o.temperature, top_k=o.top_k,
                                         warmup_streams=0 if skip_warmup else o.warmup)
    return RunConfig(model=info.model, cuts=cuts, split_index=planned.split.config, batch_size=o.batch_size,
                     num_batches=o.num_batches, warmup=0 if skip_warmup else o.warmup, in_flight=o.in_flight,
                     network=planned.network, link_mode=o.link, timeout_s=timeout_s, seed=planned.run,
                     wire_dtype=planned.wire_dtype, compression=o.compression, num_classes=o.num_classes,
                     eval_samples=eval_samples_for(o.eval_samples, planned.wire_dtype), eval_text=o.eval_text,
                     fidelity_target=o.fidelity_target,
                     dataset=o.dataset, data_dir=o.data_dir, run_key=planned.run_key,
                     config_key=planned.config_key, run=planned.run, stage_limits=info.limits,
                     max_batch_s=o.max_batch_s, prefetch_batches=o.prefetch_batches,
                     rpc=RpcOptions(transport=o.rpc_transport, source=o.rpc_source, use_pipelining=o.in_flight > 1,
                                    world_size=info.world_size) if rpc else None,
                     energy_rate_hz=o.energy_rate_hz, engine=planned.engine,
                     **stage_declarations(o, len(cuts) + 1), **extra)


def run_blocks(info: GroupInfo, planned: PlannedRun) -> list[int]:
    """The block index of each cut (the adaptive split starts with the whole model on stage 1)."""
    return [info.num_blocks] if planned.split.adaptive else list(planned.split.blocks)


def run_cuts(info: GroupInfo, planned: PlannedRun) -> list[str]:
    """The cuts a run starts at: its fine cut, or the cut of each of its blocks."""
    return [planned.split.cut] if planned.split.cut else [info.block_cuts[k] for k in run_blocks(info, planned)]


def stage_declarations(opts: SweepOptions, stages: int) -> dict[str, Any]:
    """Each stage's declared powers and memory limit: the flags', else its host's."""
    hosts = opts.testbed.hosts[:stages] if opts.testbed.remote else []

    def per_stage(flag: list, attr: str) -> list | None:
        values = []
        for j in range(stages):
            given = flag[j] if j < len(flag) else None
            values.append(given if given is not None else getattr(hosts[j], attr) if j < len(hosts) else None)
        return values if any(v is not None for v in values) else None

    return {"power_idle_w": per_stage(opts.power_idle_w, "power_idle_w"),
            "power_core_w": per_stage(opts.power_core_w, "power_core_w"),
            "memory_limits": per_stage(opts.memory_limits, "memory_limit")}


def timeout_s(opts: SweepOptions, info: GroupInfo, planned: PlannedRun, blocks: Sequence[int],
              conditions: NetworkConditions | None, compute_s: float) -> float:
    """``--timeout``, else a deadline from the bytes this run sends under its network conditions
    (None: --link none) and ``compute_s``, the slowest batch compute measured so far in this group
    (:mod:`paretopipe.network.deadlines`)."""
    o = opts
    if o.timeout is not None:
        return o.timeout
    per_image = info.payload_bytes_per_image
    if planned.prompt_len is not None:  # every stream's prefill in flight at once; a token comes back
        largest = max((per_image[k] for k in blocks if k < len(per_image)), default=0)
        return deadlines.run_timeout_s(conditions, largest * planned.prompt_len, 64, o.streams, compute_s)
    itemsize = 2 if planned.wire_dtype in ("float16", "bfloat16") else 4
    if planned.split.adaptive:  # any candidate may be chosen: the largest bounds them all
        blocks = range(len(per_image))
    largest = (info.fine_cuts.get(planned.split.cut, [0, 0])[1] if planned.split.cut else
               max((per_image[k] for k in blocks if k < len(per_image)), default=0))
    up = largest * o.batch_size * itemsize // 4
    down = o.num_classes * 4 * o.batch_size
    return deadlines.run_timeout_s(conditions, up, down, o.in_flight, compute_s)
