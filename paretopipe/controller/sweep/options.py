"""A sweep's options, and the combinations of them a sweep cannot run, refused by name before
anything starts."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from ... import engines, faults
from ...compute import cpushare
from ...errors import UsageError
from ...workload import Workload
from ...splitspec import parse_splits, split_adaptive
from ...analysis.keys import CLOSED_LOOP, placement_devices
from ...llm import llamacpp
from ...llm.shapes import workload_of
from ...network.conditions import NetworkConditions, conditions_from_values, get_conditions
from ...loadgen.settings import LoadgenOptions
from ...transport.runconfig import DEFAULT_PROMPT_LEN, LABELLED_DATASETS, LINK_MODES, eval_samples_for
from ...partition.names import DEFAULT_NUM_CLASSES
from . import rounds
from ..hosts import Testbed

BACKENDS = ("tcp", "rpc")
#: A fault sweep's deadline when --deadline-ms is not given: how long stage 1 waits for a result
#: before it serves the batch itself (so a frozen stage 2 is detected within about a second).
FAULT_DEADLINE_S = 1.0
LINKS = LINK_MODES


@dataclasses.dataclass
class SweepOptions:
    models: list[str]
    splits: str = "all"
    max_live: int = 1
    plans: list[tuple[int, ...]] | None = None
    runs: int = 3
    networks: list[str] = dataclasses.field(default_factory=lambda: ["lan"])
    backends: list[str] = dataclasses.field(default_factory=lambda: ["tcp"])
    batch_size: int = 8
    key_batch_size: int | None = None   # a search session's base batch size: run files of another name theirs
    key_in_flight: int | None = None    # ...and its base in-flight depth
    num_batches: int = 20
    warmup: int = 3
    warmup_every_run: bool = False
    in_flight: int = 1
    link: str = "emulated"
    out: str = "results"
    session: str | None = None
    resume: bool = False
    wait_time: float = 120.0
    timeout: float | None = None        # None: each run's deadline follows its link (network.deadlines)
    max_batch_s: float | None = None    # a batch slower than this makes its configuration infeasible
    prefetch_batches: int = 0           # input batches prepared ahead in a thread (--enable-prefetch)
    threads: int | None = None
    optimizations: bool = True
    dry_run: bool = False
    cleanup: bool = False
    report: bool = True
    testbed: Testbed = dataclasses.field(default_factory=Testbed)
    network_file: str | None = None
    wire_dtype: str = "float32"
    # --wire-dtype's list, each a pass of its own (None: wire_dtype alone; a search sets wire_dtype).
    wire_dtypes: list[str] | None = None
    eval_samples: int | None = None  # transport.fidelity: None is 64 where the wire is lossy
    eval_text: str | None = None  # a language model's evaluation text (transport.fidelity)
    fidelity_target: float | None = None  # --wire-dtype auto's target (transport.fidelity.chosen)
    compression: str = "none"
    # The TCP data port's --encrypt choices (transport.aead): one worker group each, since a cipher is
    # agreed per connection; the cipher is part of a configuration's key.
    ciphers: list[str] = dataclasses.field(default_factory=lambda: ["none"])
    # The data port's --transport choices (transport.messaging): one worker group each, since a
    # transport is chosen per connection; the transport is part of a configuration's key.
    transports: list[str] = dataclasses.field(default_factory=lambda: ["tcp"])
    mqtt_qos: str = "0"
    stage_cpu: list[float | None] = dataclasses.field(default_factory=lambda: [None, None])
    # Compute traces per stage (cputrace: stage name -> CSV), replayed in every run; a network may bring its own.
    stage_cpu_trace: dict[str, str] = dataclasses.field(default_factory=dict)
    stage_threads: list[int | None] = dataclasses.field(default_factory=lambda: [None, None])
    stage_devices: list[str] = dataclasses.field(default_factory=list)
    rpc_source: str = "master"
    rpc_transport: str = "uv"
    num_classes: int = DEFAULT_NUM_CLASSES
    weights: str | None = None
    dataset: str = "synthetic"
    data_dir: str | None = None
    inline_networks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    order: str = "random"
    seed: int = 0
    precision: float | None = None      # relative half-width of the 95% CIs, e.g. 0.05
    max_runs: int | None = None         # per-configuration budget of runs with a precision target
    drift_every_s: float = 60.0         # re-measure the reference this often (0: never)
    objective: str = "latency"          # the adaptive split's objective
    objectives: str | None = None       # the fronts' objectives (report, closing table): latency,throughput
    energy_rate_hz: float = 10.0        # how often each stage reads its power sensors
    # Per stage: declared idle watts and the watts one busy core adds (modelled energy where a host
    # has no sensor), and memory limits in bytes; None entries take the host's (.env / [hosts]).
    power_idle_w: list[float | None] = dataclasses.field(default_factory=list)
    power_core_w: list[float | None] = dataclasses.field(default_factory=list)
    memory_limits: list[int | None] = dataclasses.field(default_factory=list)
    deadline_s: float | None = None     # a TCP run's deadline before a batch is finished locally (static or adaptive)
    # The testbed's hosts each pass runs on, in order (placement labels, .placements); none: the first.
    placements: list[str] = dataclasses.field(default_factory=list)
    # Engines (paretopipe.engines): each label a pass of its own (one engine, or one per stage joined by "+").
    engines: list[str] = dataclasses.field(default_factory=lambda: [engines.TORCH])
    # Faults as a treatment (paretopipe.faults): each a pass of its own over the configurations.
    faults: list[str] = dataclasses.field(default_factory=lambda: [faults.NONE])
    # LoadGen scenarios, each a configuration of its own (CLOSED_LOOP: the suite's closed loop), and
    # their settings (paretopipe.loadgen.settings.LoadgenOptions.of_flags, all but the scenario).
    scenarios: list[str] = dataclasses.field(default_factory=lambda: [CLOSED_LOOP])
    loadgen_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    # A language model's generation (its models are named shapes, or one --model-dir folder): each
    # prompt length is a pass of its own over the configurations.
    model_dir: str | None = None
    prompt_lens: list[int] = dataclasses.field(default_factory=lambda: [DEFAULT_PROMPT_LEN])
    gen_tokens: int = 16
    streams: int = 1
    temperature: float = 0.0
    top_k: int = 0

    @property
    def dtypes(self) -> list[str]:
        """The wire dtypes the sweep measures, each a pass (``--wire-dtype float32,int8``)."""
        return list(self.wire_dtypes or [self.wire_dtype])

    @property
    def workload(self) -> Workload:
        """The sweep's workload (a sweep's models are all of one kind: :func:`check_workload`)."""
        return workload_of(self.models[0] if self.models else None, self.model_dir)

    def conditions(self, name: str) -> NetworkConditions:
        """A network the sweep names: defined inline (``--rate``/``--delay`` ...), or a profile by name."""
        inline = self.inline_networks.get(name)
        return conditions_from_values(name, inline) if inline else get_conditions(name, self.network_file)



def check_options(opts: SweepOptions) -> None:
    """Refuse, before anything starts, the option combinations a sweep cannot run, by name."""
    tb = opts.testbed
    unknown = [b for b in opts.backends if b not in BACKENDS]
    if unknown:
        raise UsageError(f"unknown backend {unknown[0]!r}; valid: tcp, rpc, both")
    check_workload(opts)
    check_engines(opts)
    check_faults(opts)
    check_placements(opts)
    check_rpc_codec(opts)
    check_wire_choice(opts)
    check_eval_samples(opts)
    if opts.order not in rounds.ORDERS:
        raise UsageError(f"--order {opts.order!r}: valid {', '.join(rounds.ORDERS)}")
    if opts.precision is not None and not 0 < opts.precision < 1:
        raise UsageError(f"--precision {opts.precision:.0%}: give a target between 0% and 100%, e.g. 5%")
    if opts.max_runs is not None and opts.max_runs < opts.runs:
        raise UsageError(f"--max-runs {opts.max_runs} is below --runs {opts.runs}: the budget must allow the "
                         f"minimum")
    if opts.link not in LINKS:
        raise UsageError(f"--link {opts.link!r}: valid {', '.join(LINKS)}")
    if split_adaptive(opts.splits)[1]:
        if opts.plans or "rpc" in opts.backends:
            raise UsageError("the adaptive split runs on the TCP backend with two stages: use --backend tcp "
                             "and --splits ...,adaptive")
        if opts.in_flight != 1:
            raise UsageError(f"--in-flight {opts.in_flight}: the adaptive runtime keeps one batch in flight; "
                             f"use --in-flight 1 (and compare it with static splits measured so)")
    if any(s != CLOSED_LOOP for s in opts.scenarios):
        if split_adaptive(opts.splits)[1] or opts.deadline_s is not None:
            raise UsageError("--scenario runs LoadGen over static splits, waiting for every result: use static "
                             "splits only (drop adaptive from --splits, and --deadline-ms)")
    if opts.deadline_s is not None and ("rpc" in opts.backends or opts.in_flight != 1):
        raise UsageError("--deadline-ms settles each TCP batch before the next: use --backend tcp and --in-flight 1")
    if opts.plans and "tcp" in opts.backends and opts.link == "tc" and not tb.remote:
        # On one machine every TCP stage listens on 127.0.0.1, and tc shapes by the data port: a
        # chain's middle stage cannot have that port too.
        raise UsageError("a TCP chain (--split-blocks) on this machine shapes its hops with the emulated link: use "
                         "--link emulated, hosts in .env for tc, or --backend rpc")
    if opts.link == "tc" and not (tb.iface or any(h.iface for h in tb.hosts)):
        raise UsageError("--link tc needs IFACE (in .env or --iface): the interface tc shapes on each host")
    if any(x is not None for x in opts.stage_cpu) or opts.stage_cpu_trace:
        check_cpu_emulation(opts, "--stage-cpu-trace" if opts.stage_cpu_trace else "--stage-cpu")
    if tb.remote and opts.link == "tc" and "rpc" in opts.backends:
        for h in tb.hosts:
            try:
                ipaddress.ip_address(h.address)
            except ValueError:
                raise UsageError(f"--link tc with the rpc backend shapes by peer address: give HOSTS as IP "
                                 f"addresses, not {h.address!r}")


def check_faults(opts: SweepOptions) -> None:
    """A fault is survived by stage 1 finishing batches itself: the TCP backend's two stages or a
    chain of three (here or on hosts), one batch in flight, image batches, and a deadline (the
    command line's default for a fault sweep is :data:`FAULT_DEADLINE_S`)."""
    if opts.faults == [faults.NONE]:
        return
    why = ("the rpc backend cannot yet recover a lost stage; use --backend tcp" if "rpc" in opts.backends else
           f"--streams {opts.streams}: stage 1 settles one step at a time; use --streams 1"
           if opts.streams != 1 else
           f"--in-flight {opts.in_flight}: stage 1 settles one batch at a time; use --in-flight 1"
           if opts.in_flight != 1 else
           "LoadGen waits for every result; drop --scenario" if opts.scenarios != [CLOSED_LOOP] else
           "give --deadline-ms, how long stage 1 waits for a result" if opts.deadline_s is None else None)
    if opts.plans and len(opts.plans[0]) > 2:
        why = "a chain's middle stage is restarted into a chain of three stages; give --split-blocks with two cuts"
    if why:
        raise UsageError(f"--fault {','.join(opts.faults)}: {why}")
    late = [f for f in map(faults.parse_fault, opts.faults) if f is not None and f.at_batch >= opts.num_batches]
    if late:
        raise UsageError(f"--fault {late[0].label}: batch {late[0].at_batch} is past the run's {opts.num_batches} "
                         f"measured batches (valid 0..{opts.num_batches - 1})")


def check_engines(opts: SweepOptions) -> None:
    """Engines beside torch run an image model's splits (static or adaptive) on the TCP backend;
    here, their packages must be installed (a host's own is checked by its first run)."""
    others = sorted({e for label in opts.engines for e in engines.label_parts(label)} - {engines.TORCH})
    if not others:
        return
    if engines.LLAMACPP in others:
        check_peer(opts)
        others.remove(engines.LLAMACPP)
        if not others:
            return
    why = opts.workload.refusal("engines") or \
        ("the rpc backend's ranks run torch modules; use --backend tcp" if "rpc" in opts.backends else None)
    if why:
        raise UsageError(f"--engine {','.join(opts.engines)}: {why}; or use --engine torch")
    for label in opts.engines:
        for plan in opts.plans or [()]:
            engines.check_label(label, len(plan) + 1 if plan else 2)
        for i, device in enumerate(opts.stage_devices):
            if device != "cpu" and engines.stage_engine(label, i) != engines.TORCH:
                raise UsageError(f"--engine {label}: stage {i + 1} runs on {device}, and {engines.stage_engine(label, i)} "
                                 f"runs a stage on the CPU; give that stage torch (--stage-engines)")
    if not opts.testbed.remote:
        for engine in others:
            engines.require(engine)


def check_peer(opts: SweepOptions) -> None:
    """llama.cpp's RPC split (--engine llamacpp): a GGUF language model's static splits (or plans,
    one RPC server per later stage) that its client can make, over a link the relay emulates or, on
    hosts, tc; its binaries built (here; a host's own are checked when its worker starts)."""
    engine, remote = engines.LLAMACPP, opts.testbed.remote
    why = opts.workload.refusal("llamacpp") or (
           "its RPC is a TCP protocol of its own: drop --backend rpc"
           if "rpc" in opts.backends else "on this machine the relay carries its traffic over the emulated link: use "
           "--link emulated or none (tc shapes it between hosts)" if opts.link == "tc" and not remote
           else "its programs take a fixed CPU share (--stage-cpu), not a trace's: drop --stage-cpu-trace and "
           "networks' cpu_trace" if opts.stage_cpu_trace or any(opts.conditions(n).cpu_traces for n in opts.networks)
           else "it has no fault injection: drop --fault" if opts.faults != [faults.NONE]
           else "LoadGen drives our engine's stages: drop --scenario" if opts.scenarios != [CLOSED_LOOP]
           else None)
    if why:
        raise UsageError(f"--engine {engine}: {why}")
    layers = None if remote else llamacpp.gguf_facts(llamacpp.gguf_of(opts.models[0], opts.model_dir)).layers
    if not opts.plans or any(len(placement_devices(p)) == 2 and not plans_of(opts, 2) for p in opts.placements):
        _check_peer_splits(opts, layers)
    if layers is not None:  # on hosts, the GGUF is the host's: its worker refuses a split it cannot make
        for plan in opts.plans or []:
            llamacpp.offload(list(plan), layers)
        llamacpp.binaries()


def _check_peer_splits(opts: SweepOptions, layers: int | None) -> None:
    """--splits, where llama.cpp runs them: static splits its client can make."""
    static, policies = split_adaptive(opts.splits)
    if policies or static.strip().lower() == "all":
        valid = f"1..{layers + 1}; give --splits 1-{layers + 1}" if layers else \
            "1..L+1 of a model of L layers; give them"
        raise UsageError(f"--engine {engines.LLAMACPP} --splits {opts.splits}: llama.cpp's client keeps the embedding "
                         f"and its servers the head, so its splits are {valid} or a list of them")
    if layers is not None:
        for k in parse_splits(static, layers + 2):
            llamacpp.offloaded_layers(k, layers)


def check_rpc_codec(opts: SweepOptions) -> None:
    """The rpc backend sends what a stage computed (a language model's hidden state in its cut
    dtype): a cast or a codec of an image model's activations is the TCP backend's, and an rpc run
    would be recorded with one it did not make."""
    if "rpc" not in opts.backends:
        return
    if opts.compression != "none":
        raise UsageError(f"--compression {opts.compression} with the rpc backend: its activations cross as "
                         f"computed, uncompressed; use --backend tcp")
    lossy = [d for d in opts.dtypes if d != "float32"]
    why = opts.workload.refusal("rpc_wire_dtype")
    if lossy and why:
        raise UsageError(f"--wire-dtype {lossy[0]} with the rpc backend: {why}")


def check_wire_choice(opts: SweepOptions) -> None:
    """``--wire-dtype auto`` chooses a cut's dtype to a target (a language model's by its
    next-token agreement)."""
    if "auto" in opts.dtypes and opts.fidelity_target is None:
        raise UsageError("--wire-dtype auto needs --fidelity-target, the share of the unsplit model's top-1 (or "
                         "accuracy) to keep, e.g. 0.99")


def check_eval_samples(opts: SweepOptions) -> None:
    """A local folder smaller than the evaluation asked of it (``--eval-samples``, 64 where a wire
    dtype is lossy) is refused now, not in every run's record after its timed batches."""
    if opts.testbed.remote or opts.dataset.split(":")[0] not in LABELLED_DATASETS:  # a generation's is synthetic
        return
    wanted = max(eval_samples_for(opts.eval_samples, d) for d in opts.dtypes)
    if not wanted:
        return
    # lazy for start-up: torchvision
    from ...transport.inputs import SampleSet

    held = len(SampleSet(opts.dataset, 32, 1, opts.data_dir))
    if wanted > held:
        raise UsageError(f"--eval-samples {wanted}: the dataset {opts.dataset} holds {held} images; give "
                         f"--eval-samples {held} or fewer")


def check_workload(opts: SweepOptions) -> None:
    """A sweep's models are of one kind, and a setting of the other kind's is refused in one line
    (``Workload.refusal``): a language model's sweep asks nothing of image batches, nor an image
    model's of tokens."""
    kinds = {workload_of(m, opts.model_dir) for m in opts.models}
    if len(kinds) > 1:
        raise UsageError(f"--models {','.join(opts.models)}: a sweep measures language models or image models; "
                         f"sweep each kind in a session of its own")
    bounds = any(opts.loadgen_settings.get(f) is not None for f in ("ttft_bound_s", "tpot_bound_s"))
    opts.workload.refuse(token_bounds=bounds, eval_text=opts.eval_text, adaptive=split_adaptive(opts.splits)[1])
    if opts.model_dir is not None and len(opts.models) > 1:
        raise UsageError("--model-dir names one model: give no --models beside it")
    if opts.deadline_s is not None and opts.streams != 1:
        raise UsageError(f"--deadline-ms with --streams {opts.streams}: a deadline settles one step at a time; "
                         f"use --streams 1")
    if opts.workload.generates:  # a language model's queries are prompts: its scenarios and settings now
        for scenario in opts.scenarios:
            if scenario != CLOSED_LOOP:
                LoadgenOptions.of_flags(scenario, **opts.loadgen_settings).for_tokens()


def check_cpu_emulation(opts: SweepOptions, what: str) -> None:
    """CPU shares and compute traces act on this machine's TCP stage workers through cgroups."""
    if opts.testbed.remote:
        raise UsageError(f"{what} emulates slower devices on this machine; with hosts in .env the "
                         f"stages already run on real devices (use --local to emulate)")
    if "rpc" in opts.backends and opts.stage_cpu_trace:
        raise UsageError(f"{what} replays on the TCP backend's stage workers; use --backend tcp")
    if opts.plans:
        raise UsageError(f"{what} applies to the two stages of a pair; drop --split-blocks")
    cpushare.Hierarchy.detect()  # a clear error now rather than from every worker
    cpushare.check_writable()


def stage_count(opts: SweepOptions) -> int:
    """How many stages every configuration of the sweep (or of one placement's pass,
    placements.pass_options) has: a plan's cuts plus one, else two."""
    return (len(opts.plans[0]) + 1) if opts.plans else 2


def check_placements(opts: SweepOptions) -> None:
    """Every placement of --placements (controller.sweep.placements) has something to run: a plan of
    as many stages, or ``--splits`` for two hosts."""
    for label in opts.placements:
        stages = len(placement_devices(label))
        if not plans_of(opts, stages) and not (stages == 2 and not opts.plans):
            lengths = sorted({len(p) + 1 for p in opts.plans or []}) or [2]
            raise UsageError(f"--placements {label}: {stages} hosts need a plan of {stages} stages in --split-blocks "
                             f"(its plans have {', '.join(map(str, lengths))}); e.g. --split-blocks "
                             f"\"{';'.join(','.join(map(str, p)) for p in opts.plans or [(3,)])};"
                             f"{','.join(str(k + 2) for k in range(stages - 1))}\"")
    sizes = {len(placement_devices(label)) for label in opts.placements}
    unused = [p for p in opts.plans or [] if opts.placements and len(p) + 1 not in sizes]
    if unused:
        raise UsageError(f"--split-blocks plan {','.join(map(str, unused[0]))} has {len(unused[0]) + 1} stages, and no "
                         f"placement of --placements {','.join(opts.placements)} has {len(unused[0]) + 1} hosts")


def plans_of(opts: SweepOptions, stages: int) -> list[tuple[int, ...]]:
    """The plans of --split-blocks with ``stages`` stages (a placement of as many hosts runs them)."""
    return [p for p in opts.plans or [] if len(p) + 1 == stages]
