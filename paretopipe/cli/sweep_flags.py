"""The sweep's options, each declared once: its flag, type, default, group and help; the
``SweepOptions`` field it sets; and how a session's resolved ``experiment.toml`` stores it.

One table generates the sweep's parser (:func:`add_flags`), the simple fields of its options
(:func:`simple_fields`), the resolved table (:func:`resolved_table`) and the experiment file's
sets of invocation-only and harmless options; the experiment reader checks a file's keys
against the same parser.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from ..analysis.keys import NO_FAULT
from ..loadgen.settings import CLOSED_LOOP
from ..options import flags
from ..controller.sweep.options import FAULT_DEADLINE_S
from ..transport import aead, messaging
from .common import (add_common_flags, add_dataset_flags, add_prefetch_flags, nonneg_float, percent,
                     port_or_zero, positive_float, positive_int)
from .report import add_objectives_flag
from ..argtypes import backend_list

if TYPE_CHECKING:
    from ..controller.sweep import SweepOptions

#: The resolved table leaves out what a session cannot repeat or what is written out elsewhere.
NOT_STORED = None


@dataclasses.dataclass(frozen=True)
class Flag:
    """One option of the sweep.

    ``field``: the ``SweepOptions`` attribute that the flag's value sets as it is ("" when
    ``options_from_args`` derives the field from this flag and others). ``stored``: the resolved
    table's value for the session's options (``True``: the field as it is; ``None``: not stored).
    ``invocation``: how to run this command, never taken from an experiment file. ``harmless``:
    ``--resume`` may change it freely, since it does not change what is measured."""

    flags: tuple[str, ...]
    group: str
    help: str = ""
    dest: str = ""
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    store_true: bool = False
    metavar: str | None = None
    nargs: str | None = None  # "?": the flag alone gives ``const``
    const: Any = None
    field: str | None = None
    stored: bool | Callable[[SweepOptions], Any] | None = True
    invocation: bool = False
    harmless: bool = False

    @classmethod
    def of(cls, row: flags.Option, group: str, aliases: tuple[str, ...] = (), **kw: Any) -> "Flag":
        """The sweep's flag for a catalogue row (:mod:`paretopipe.options.flags`): its flags, type,
        default, choices and help, with the sweep's own group, ``aliases`` and (``kw``) the rest."""
        base = dict(help=row.help, type=row.type, default=row.default, choices=row.choices, metavar=row.metavar,
                    store_true=row.action == "store_true")
        return cls(row.flags + aliases, group, **{**base, **kw})

    @property
    def name(self) -> str:
        return self.dest or self.flags[0].lstrip("-").replace("-", "_")

    @property
    def option(self) -> str:
        """The SweepOptions field this flag sets as it is ("" when derived)."""
        return self.name if self.field is None else self.field

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        kw: dict[str, Any] = {"dest": self.name, "help": self.help}
        if self.store_true:
            kw["action"] = "store_true"
        else:
            kw.update(default=self.default, type=self.type, choices=self.choices, metavar=self.metavar,
                      nargs=self.nargs, const=self.const)
        group.add_argument(*self.flags, **{k: v for k, v in kw.items() if v is not None or k == "default"})


def _joined(values: list) -> str | None:
    """A per-stage list as its flag writes it (``1,`` for a stage left to its host), or None."""
    return ",".join("" if v is None else str(v) for v in values) if any(v is not None for v in values) else None


WHAT, GENERATE, ORDER, RUN, LOADGEN, MEASURE, WHERE, FILES, OUTPUT = (
    "what to sweep", "a language model's generation (--model tiny-lm, smollm2-135m, ... or --model-dir DIR)",
    "order and repetitions", "each run", "MLPerf LoadGen scenarios (--scenario)",
    "energy, memory and the fronts' objectives", "where", "experiment files", "output")


def _generation(field: str) -> Callable[[SweepOptions], Any]:
    """How the resolved table stores a generation's setting: a language model's sweep only."""
    return lambda o: getattr(o, field) if o.workload.generates else None


def _loadgen_value(field: str) -> Callable[[SweepOptions], Any]:
    """How the resolved table stores one LoadGen setting (its flag's unit: the bound in ms)."""
    def stored(o: SweepOptions) -> Any:
        value = o.loadgen_settings.get(field)
        return value * 1e3 if value is not None and field in flags.MS_FIELDS else value
    return stored

FLAGS: tuple[Flag, ...] = (
    # -- what to sweep -----------------------------------------------------------------------------
    Flag.of(flags.MODEL, WHAT, help="one model (mobilenetv2 when neither --model nor --models is given)",
         field="", stored=NOT_STORED),
    Flag(("--models",), WHAT, "comma list of models", field="", stored=lambda o: list(o.models)),
    Flag(("--splits",), WHAT, "all, a list 1,4,8, or ranges 2-10 (0 and K are the baselines); add adaptive for the "
         "runtime that picks the split per batch from the measured link (all,adaptive); fine cuts by name too, "
         "a live set of several tensors among them (0,maxpool+layer1_0_relu,9; paretopipe split --list --fine)",
         default="all"),
    Flag.of(flags.MAX_LIVE, WHAT, help="widen --splits all with every fine cut that at most this many tensors cross "
            "(a skip connection's, a detector's pyramid levels); 1 (the default) is the block splits only"),
    Flag.of(flags.SPLIT_BLOCKS, WHAT, help="N-stage plans for the rpc backend, ';' between plans: 3,9;5,12 (as paretopipe "
         "predict prints them)", field="", stored=lambda o: [list(p) for p in o.plans] if o.plans else None),
    Flag(("--placements",), WHAT, "which of the testbed's hosts run the stages, in order, each a pass of its own: "
         "1-3-2 (stage 1 on HOSTS' first, stage 2 on its third, stage 3 on its second), comma-separated, or all "
         "(every ordered subset of two hosts or more that begins with the first); m hosts run --split-blocks' plans "
         "of m stages (plans of several lengths: \"3;2,4\"), two hosts --splits without one; the report then says "
         "what each extra device buys", field="", stored=lambda o: list(o.placements) or None),
    Flag(("--runs",), WHAT, "repetitions per configuration", type=positive_int, default=3),
    Flag.of(flags.NETWORK, WHAT, aliases=("--networks", "--profiles"), help="comma list of named network conditions from "
         "profiles.toml (--profiles is the anchor's name); default lan, or only the trace with --trace",
         dest="network", field="", stored=NOT_STORED),
    Flag.of(flags.NETWORK_FILE, WHAT, aliases=("--profiles-file",), stored=NOT_STORED),
    Flag.of(flags.TRACE, WHAT, help="a rate trace (Mahimahi or time_s,rate_mbit CSV) for both directions: adds a network "
         "named trace-<file stem> to --network (per-direction traces: trace_up/trace_down in a network file)",
         field="", stored=NOT_STORED),
    Flag(("--backend",), WHAT, "comma list of backends: tcp, rpc (both: tcp,rpc)", default="tcp", type=backend_list,
         field="", stored=lambda o: ",".join(o.backends)),
    Flag.of(flags.NUM_CLASSES, WHAT),
    Flag.of(flags.WEIGHTS, WHAT),
    # -- a language model's generation -------------------------------------------------------------
    Flag.of(flags.MODEL_DIR, GENERATE, stored=_generation("model_dir")),
    Flag.of(flags.PROMPT_LENS, GENERATE, field="prompt_lens", stored=_generation("prompt_lens")),
    Flag.of(flags.GEN_TOKENS, GENERATE, stored=_generation("gen_tokens")),
    Flag.of(flags.STREAMS, GENERATE, stored=_generation("streams")),
    Flag.of(flags.TEMPERATURE, GENERATE, stored=_generation("temperature")),
    Flag.of(flags.TOP_K, GENERATE, stored=_generation("top_k")),
    # -- order and repetitions ---------------------------------------------------------------------
    Flag(("--order",), ORDER, "random: seeded rounds, each configuration once per round in a new order, so drift "
         "spreads over every split; sequential: every run of a configuration back to back, splits in order (the "
         "anchor's)", default="random", choices=("random", "sequential")),
    Flag.of(flags.SEED, ORDER, help="seed of the random order (recorded in the session)"),
    Flag(("--precision",), ORDER, "keep measuring each configuration, in further rounds, until the 95%% CIs of its "
         "median latency and its throughput are within +-this (e.g. 5%%), or --max-runs is spent", type=percent,
         stored=lambda o: None if o.precision is None else f"{o.precision * 100:g}%"),
    Flag(("--max-runs",), ORDER, "per-configuration budget of runs with --precision (3 x --runs when not given)",
         type=positive_int),
    Flag(("--drift-every",), ORDER, "re-measure a reference configuration this often, seconds (0: never; random "
         "order only); runs measured during a drift are measured again", type=nonneg_float, default=60.0,
         field="drift_every_s", stored=lambda o: o.drift_every_s),
    # -- each run ----------------------------------------------------------------------------------
    Flag.of(flags.BATCH_SIZE, RUN),
    Flag.of(flags.NUM_BATCHES, RUN),
    Flag.of(flags.WARMUP, RUN, help="warm-up batches on a cut's first run in each worker group (later runs of that cut "
         "skip them: its one-time costs are paid; the record's config.warmup says which)"),
    Flag(("--warmup-every-run",), RUN, "warm up before every run, as separate processes per run would have to",
         store_true=True),
    Flag.of(flags.IN_FLIGHT, RUN),
    Flag.of(flags.WIRE_DTYPE_LIST, RUN, field="",
            stored=lambda o: list(o.dtypes) if len(o.dtypes) > 1 else o.dtypes[0]),
    Flag.of(flags.EVAL_SAMPLES, RUN),
    Flag.of(flags.EVAL_TEXT, RUN),
    Flag.of(flags.FIDELITY_TARGET, RUN),
    Flag.of(flags.COMPRESSION, RUN),
    Flag.of(flags.ENCRYPT, RUN, help=f"comma list of the TCP data port's ciphers to sweep ({', '.join(aead.CHOICES)}), "
         "e.g. none,aesgcm: each is a configuration of its own (AEAD, keys from PARETOPIPE_SECRET), with its cipher "
         "and seal and open times recorded, so the report shows what privacy costs at every split",
         choices=None, field="", stored=lambda o: list(o.ciphers) if o.ciphers != ["none"] else None),
    Flag.of(flags.MQTT_QOS, RUN, stored=lambda o: o.mqtt_qos if o.mqtt_qos != "0" else None),
    Flag.of(flags.TRANSPORT, RUN, help=f"comma list of the data port's protocols to sweep ({', '.join(messaging.TRANSPORTS)}), "
         "e.g. tcp,websocket,mqtt: each is a configuration of its own carrying the same frames, with its messages, "
         "frame and socket bytes recorded (MQTT: through a Mosquitto broker the sweep starts here, or MQTT_BROKER "
         "in .env with hosts)", choices=None, field="",
         stored=lambda o: list(o.transports) if o.transports != ["tcp"] else None),
    # --dataset, --data-dir, --enable-prefetch and --prefetch-batches: common.add_dataset_flags and
    # add_prefetch_flags, added after --encrypt (see add_flags); their fields are below.
    Flag.of(flags.LINK, RUN, help="emulated (the local choice): in-process link; tc: qdiscs on the hosts' IFACE (the "
            "choice with hosts); none", field="", stored=lambda o: o.link),
    Flag.of(flags.OBJECTIVE, RUN),
    Flag.of(flags.DEADLINE_MS, RUN, help="every TCP run, static or adaptive (one batch in flight): a result later "
            "than this is finished on stage 1 instead", field="", stored=lambda o: None if o.deadline_s is None else o.deadline_s * 1e3),
    Flag(("--fault",), RUN, "comma list of faults, each a pass of its own over the configurations: none, "
         "stage2:kill@B+S (SIGKILL stage 2 as measured batch B starts, start it again S seconds later), "
         "stage2:freeze@B+S (SIGSTOP for S seconds), link:down@B+S (the link carries nothing for S seconds: held at stage 1 on the emulated link, "
         "dropped by the hosts' qdiscs under --link tc); "
         "TCP, two stages or a chain of three, here or on hosts; each run records the time to detect and to "
         "recover, the batches served on stage 1, the latency p99 in the fault's window, what the outage cost and "
         f"any batch lost or served twice (--deadline-ms defaults to {FAULT_DEADLINE_S * 1e3:g})", field="",
         stored=lambda o: list(o.faults) if o.faults != [NO_FAULT] else None),
    Flag.of(flags.RPC_SOURCE, RUN),
    Flag.of(flags.RPC_TRANSPORT, RUN),
    # -- MLPerf LoadGen scenarios -----------------------------------------------------------------
    Flag.of(flags.SCENARIOS_LIST, LOADGEN, field="scenarios",
            stored=lambda o: list(o.scenarios) if o.scenarios != [CLOSED_LOOP] else None),
    Flag(flags.MLPERF_COMPLIANT.flags, LOADGEN, flags.MLPERF_COMPLIANT.help, store_true=True, field="",
         stored=lambda o: bool(o.loadgen_settings.get("compliant")) or None),
    *(Flag.of(row, LOADGEN, field="", stored=_loadgen_value(field)) for row, field in flags.LOADGEN_VALUES),
    # -- energy, memory and the fronts' objectives (--objectives: report.add_objectives_flag) ------
    Flag(("--energy-rate-hz",), MEASURE, "how often each stage reads its host's power sensors (RAPL, NVML, a Pi 5's "
         "PMIC, INA2xx)", type=positive_float, default=10.0,
         stored=lambda o: o.energy_rate_hz if o.energy_rate_hz != 10.0 else None),
    Flag.of(flags.POWER_IDLE_W, MEASURE, type=None, help="per stage, e.g. 2.7,45: a device's idle watts, for the modelled energy of a "
         "host without sensors (else POWER_IDLE_W per host in .env)", field="",
         stored=lambda o: _joined(o.power_idle_w)),
    Flag.of(flags.POWER_CORE_W, MEASURE, type=None, help="per stage, e.g. 0.9,15: the watts one busy core adds, x the stage's CPU "
         "seconds = its modelled energy (else POWER_CORE_W per host in .env)", field="",
         stored=lambda o: _joined(o.power_core_w)),
    Flag(("--memory-limit",), MEASURE, "stage1=1GiB or one size per stage (1GiB,16GiB): a stage whose peak memory "
         "exceeds it is marked in the records and the report (else MEMORY_LIMITS per host in .env)", field="",
         stored=lambda o: _joined(o.memory_limits)),
    # -- where -------------------------------------------------------------------------------------
    Flag.of(flags.ENV_FILE, WHERE, help="hosts, SSH settings and the shared secret (see .env.example)", field="", stored=NOT_STORED, harmless=True),
    Flag.of(flags.LOCAL, WHERE, help="ignore hosts in .env and run every stage here", field="",
         stored=lambda o: not o.testbed.remote, harmless=True),
    Flag(("--hosts-required",), WHERE, "refuse to run locally: .env must name the hosts (partition.sh's mode)",
         store_true=True, field="", stored=NOT_STORED, harmless=True),
    Flag(("--iface",), WHERE, "with --link tc: interface to shape (IFACE from .env otherwise)", field="",
         stored=NOT_STORED, harmless=True),
    Flag.of(flags.STAGE_DEVICES, WHERE, help="device per stage, e.g. cpu,cuda (with hosts: overrides DEVICES/PI1_DEVICE/"
         "GPU_DEVICE)", field="", stored=lambda o: _joined(o.stage_devices)),
    Flag.of(flags.ENGINE_LIST, WHERE, field="",
            stored=lambda o: list(o.engines) if o.engines != ["torch"] and "+" not in o.engines[0] else None),
    Flag.of(flags.STAGE_ENGINES, WHERE, field="",
            stored=lambda o: o.engines[0].replace("+", ",") if "+" in o.engines[0] else None),
    Flag.of(flags.THREADS, WHERE, help="threads per stage, torch's and every engine's intra-op (cores / stages "
            "otherwise)"),
    Flag(("--stage-threads",), WHERE, "torch threads per stage, e.g. 1,2 (overrides --threads)", field="",
         stored=lambda o: _joined(o.stage_threads)),
    Flag(("--stage-cpu",), WHERE, "CPU share per stage via cgroup quota, e.g. 0.25,1 (an edge device and a server on "
         "one machine; local stages: a TCP worker's compute threads, an RPC rank's whole process)", field="",
         stored=lambda o: _joined(o.stage_cpu)),
    Flag.of(flags.STAGE_CPU_TRACE, WHERE, help=flags.STAGE_CPU_TRACE.help + " (local TCP only)", field="",
            stored=lambda o: ",".join(f"{k}={v}" for k, v in sorted(o.stage_cpu_trace.items())) or None),
    Flag(("--no-optimizations",), WHERE, "do not pin stages to separate cores (the anchor's behaviour; for "
         "comparisons)", store_true=True, field="", stored=lambda o: not o.optimizations),
    # -- experiment files --------------------------------------------------------------------------
    Flag(("--config",), FILES, "experiment TOML file ([sweep] options named as these flags, [networks.NAME], "
         "[hosts]); flags given here override it", field="", stored=NOT_STORED, invocation=True),
    Flag(("--rerun",), FILES, "repeat a session's stored experiment (SESSION/experiment.toml) as a new session",
         metavar="SESSION", field="", stored=NOT_STORED, invocation=True),
    Flag(("--force-resume",), FILES, "let --resume continue a session with options that differ from its stored "
         "experiment", store_true=True, field="", stored=NOT_STORED, invocation=True),
    # -- output ------------------------------------------------------------------------------------
    Flag.of(flags.OUT, OUTPUT, help="results folder; each sweep is a session inside it", default="results",
         stored=NOT_STORED, harmless=True),
    Flag(("--session",), OUTPUT, "session folder name (a timestamp when not given)", stored=NOT_STORED,
         invocation=True),
    Flag(("--resume",), OUTPUT, "continue the newest (or --session) session, skipping completed runs",
         store_true=True, stored=NOT_STORED, invocation=True),
    Flag(("--live",), OUTPUT, "serve a live page of this session while it runs, on 127.0.0.1:PORT (8765 when no port "
         "is given; 0: any free one): progress, the fronts forming, the newest run, the policies' choices "
         "(paretopipe watch SESSION does it for any session)", type=port_or_zero, nargs="?", const=8765,
         metavar="PORT", field="", stored=NOT_STORED, invocation=True, harmless=True),
    Flag(("--cleanup",), OUTPUT, "delete per-run JSONs after consolidation (CSVs stay)", store_true=True,
         stored=NOT_STORED, invocation=True),
    Flag(("--no-report",), OUTPUT, "skip the Pareto report at the end", store_true=True, field="",
         stored=NOT_STORED, invocation=True),
    Flag(("--wait-time",), OUTPUT, "readiness timeout for stage processes, seconds", type=positive_float,
         default=120.0, harmless=True),
    Flag.of(flags.TIMEOUT, OUTPUT),
    Flag.of(flags.MAX_BATCH_S, OUTPUT, help="a batch slower than this (seconds, end to end) makes its configuration "
            "infeasible: recorded as such, drawn as dominated, and the sweep goes on"),
    Flag.of(flags.DRY_RUN, OUTPUT, help="print the plan and its size; run nothing", stored=NOT_STORED,
         invocation=True),
    Flag(("--check",), OUTPUT, "check every host (paretopipe doctor) before the sweep", store_true=True, field="",
         stored=NOT_STORED, invocation=True),
)

#: Options that the shared flag helpers add (common.add_dataset_flags, add_prefetch_flags and
#: report.add_objectives_flag): the fields they set and how the resolved table stores them.
HELPER_STORED: dict[str, Callable[[SweepOptions], Any]] = {
    "dataset": lambda o: o.dataset, "data_dir": lambda o: o.data_dir,
    "prefetch_batches": lambda o: o.prefetch_batches, "objectives": lambda o: o.objectives}
#: Fields derived from several flags (options_from_args: --network and --trace): resolved as they are.
DERIVED_STORED: dict[str, Callable[[SweepOptions], Any]] = {"networks": lambda o: list(o.networks)}
#: Flags of the common helpers that are about this invocation only.
COMMON_INVOCATION = {"debug", "quiet", "help", "version"}


#: The shared flag helpers, placed where they belong: at the head of a group, or after a flag.
_GROUP_HEAD: dict[str, Callable[[Any], None]] = {MEASURE: add_objectives_flag}
_AFTER: dict[str, Callable[[Any], None]] = {
    "encrypt": lambda g: (add_dataset_flags(g, default="auto"), add_prefetch_flags(g))}


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every sweep flag, in its group and in the table's order."""
    groups: dict[str, Any] = {}
    for flag in FLAGS:
        if flag.group not in groups:
            groups[flag.group] = p.add_argument_group(flag.group)
            _GROUP_HEAD.get(flag.group, lambda g: None)(groups[flag.group])
        flag.add_to(groups[flag.group])
        _AFTER.get(flag.name, lambda g: None)(groups[flag.group])
    add_common_flags(p)


def simple_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The SweepOptions fields that flags set as they are, from parsed ``args``."""
    return {f.option: getattr(args, f.name) for f in FLAGS if f.option}


def resolved_table(opts: SweepOptions) -> dict[str, Any]:
    """The ``[sweep]`` table of a session's experiment.toml: every option as it was resolved."""
    table: dict[str, Any] = {}
    for f in FLAGS:
        if f.stored is True:
            table[f.name] = getattr(opts, f.option)
        elif callable(f.stored):
            table[f.name] = f.stored(opts)
    for key, value in {**HELPER_STORED, **DERIVED_STORED}.items():
        table[key] = value(opts)
    return table


INVOCATION = {f.name for f in FLAGS if f.invocation} | COMMON_INVOCATION
HARMLESS = {f.name for f in FLAGS if f.harmless}
