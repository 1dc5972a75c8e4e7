"""The options that more than one command takes, each declared once: its flags, value type,
default, choices (named where the values live: ``transport.runconfig``, ``partition.names``) and
help. Every parser that takes one adds it from its row here: the sweep's table, the stages, the
RPC ranks, doctor, profile, split, predict, and the command lines of the processes the sweeper
starts (:class:`CommandLine`: one dataclass writes a process's argv and parses it back).

Here, not in ``cli/``, because the stage workers and ranks (``controller/``) parse them too and
nothing may import the command-line layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Callable, Sequence, TypeVar

from ..argtypes import (list_of, nonneg_float, nonneg_int, one_of, port_number, positive_float, positive_int,
                        unit_share, watts_per_stage)
from ..loadgen.settings import (CLOSED_LOOP, COMPLIANT_MIN_DURATION_S, MODES, SCENARIOS, SHORT_MIN_DURATION_S, SHORT_MIN_QUERIES)
from ..partition.names import DEFAULT_NUM_CLASSES
from ..transport import aead
from ..transport.messaging import TRANSPORTS
from ..transport.runconfig import COMPRESSIONS, LINK_MODES, OBJECTIVES, RPC_SOURCES, RPC_TRANSPORTS
from ..engines import ENGINES, PEERS, parse_engines
from ..wiredtype import WIRE_DTYPE_CHOICES

@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``flags`` (the first names it; the rest are aliases), its value ``type`` (None:
    text), ``default``, ``choices``, ``help`` (argparse prints the default; the help never does)
    and ``action`` ("store_true": a switch)."""

    flags: tuple[str, ...]
    help: str = ""
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    action: str | None = None

    @property
    def name(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")

    def variant(self, **changes: Any) -> "Option":
        """This option as one command takes it: its own help, default or value type (the sweep's
        comma list of what a stage takes one of), under the same flag."""
        return dataclasses.replace(self, **changes)

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, required: bool = False,
               dest: str | None = None, aliases: tuple[str, ...] = (), **changes: Any) -> argparse.Action:
        """Add this option to ``parser``. A command may give its own ``default``, ``help``, ``type``
        or ``metavar`` (``changes``: where it means something more particular there, as predict's
        batch of 1) and ``aliases`` (the anchor's ``--model-name``)."""
        row = self.variant(**changes) if changes else self
        kw: dict[str, Any] = {"dest": dest or self.name, "help": row.help}
        if row.action:
            kw["action"] = row.action
        else:
            kw.update(type=row.type, choices=list(row.choices) if row.choices else None, metavar=row.metavar)
        if required:
            kw["required"] = True
        elif not row.action:
            kw["default"] = row.default
        return parser.add_argument(*self.flags, *aliases, **{k: v for k, v in kw.items() if v is not None or k == "default"})


MODEL = Option(("--model",), "zoo name (mobilenetv2, resnet50, vit_b_16, ...), a registered model, or a model file")
NUM_CLASSES = Option(("--num-classes",), "classes of the classifier head (the shape of the default weights; a "
                     "state dict of another head needs its own)", positive_int, DEFAULT_NUM_CLASSES)
WEIGHTS = Option(("--weights",), "state-dict .pth to load, or a torchvision weight name (DEFAULT, IMAGENET1K_V1, "
                 "...: from torch's hub cache, downloaded only when online) (else models/<name>.pth if present, else "
                 "the deterministic default weights); it must exist on every host")
MODELS_DIR = Option(("--models-dir",), "folder searched for <name>.pth (./models when not given)")
DEVICE = Option(("--device",), "cpu or cuda[:N]", default="cpu")
THREADS = Option(("--threads",), "torch intra-op threads (match the stage that will run here)", positive_int)
CPUS = Option(("--cpus",), "CPUs to pin to, e.g. 0 or 0-3 (as the sweeper pins stages)")
CPU_SHARE = Option(("--cpu-share",), "CPU share of the compute threads through a cgroup quota (1 = one core), "
                   "applied after the model is built", positive_float)
STAGE_CPU_TRACE = Option(("--stage-cpu-trace",), "compute trace per stage, stage1=FILE[,stage2=FILE] (CSV "
                         "time_s,cpu_share, or a shipped name: pi4-throttle, noisy-neighbour): the stage's CPU share "
                         "follows it through a cgroup quota during each run, from a seeded offset",
                         metavar="STAGE=FILE")
# The runtime policies' variance detection (--split adaptive or sciot); None: SCIoT's defaults.
EMA_ALPHA = Option(("--ema-alpha",), "weight of the newest batch in each segment's smoothed compute time "
                   "(SCIoT: 0.2)", positive_float)
CV_THRESHOLD = Option(("--cv-threshold",), "a segment whose compute varies more than this (coefficient of "
                      "variation over the window) is re-profiled with the next one (SCIoT: 0.15)", positive_float)
VARIANCE_WINDOW = Option(("--variance-window",), "batches in each segment's sliding window (SCIoT: 10)", positive_int)
LOCAL_PROBABILITY = Option(("--local-probability",), "sciot only: the chance a batch runs whole on stage 1 to "
                           "refresh its times (SCIoT's example: 0.1)", nonneg_float)
POLICY_FLAGS = (EMA_ALPHA, CV_THRESHOLD, VARIANCE_WINDOW, LOCAL_PROBABILITY)
BATCH_SIZE = Option(("--batch-size",), "images per batch", positive_int, 8)
WIRE_DTYPE = Option(("--wire-dtype", "--cut-dtype"), "dtype of what crosses a cut, for every model: float32, "
                    "float16 or bfloat16 (a cast), int8 (one float32 scale per channel of an image's activation, per "
                    "token of a hidden state) or int4 (two values a byte, one float32 scale per 32 values)",
                    default="float32", choices=WIRE_DTYPE_CHOICES)
WIRE_DTYPE_LIST = WIRE_DTYPE.variant(help=f"comma list of the dtypes of what crosses a cut ({', '.join(WIRE_DTYPE_CHOICES)}), "
                                    "each a pass of its own over the configurations: float32 to bfloat16 a cast, int8 "
                                    "one float32 scale per channel (per token of a hidden state), int4 two values a "
                                    "byte and one float32 scale per 32 values; auto the fewest bits that keep "
                                    "--fidelity-target, per cut",
                                    type=list_of(one_of(WIRE_DTYPE_CHOICES), "wire_dtype_list"), default=["float32"],
                                    choices=None)
FIDELITY_TARGET = Option(("--fidelity-target",), "with --wire-dtype auto: the share of the unsplit float32 model's "
                         "top-1 (its accuracy, on labelled data) the cut's dtype must keep on a calibration set; the "
                         "fewest bytes that do are chosen before the timed batches (int4, int8, float16, bfloat16, "
                         "float32)", unit_share, None)
COMPRESSION = Option(("--compression",), "codec of the activations on the wire", default="none",
                     choices=COMPRESSIONS)
RPC_TRANSPORT = Option(("--rpc-transport",), "uv: TCP even on one host; auto: TensorPipe may use shared memory",
                       default="uv", choices=RPC_TRANSPORTS)
RPC_SOURCE = Option(("--rpc-source",), "master: the master only holds the data (the anchor's layout; one extra "
                    "hop); stage1: the master computes stage 1 itself, as the TCP backend's data source does",
                    default="master", choices=RPC_SOURCES)
LINK = Option(("--link",), "how the network conditions are applied: emulated (an in-process link), tc "
              "(qdiscs on the interface), none", choices=LINK_MODES)
OBJECTIVE = Option(("--objective",), "what the adaptive split optimises with the cost model", default="latency",
                   choices=OBJECTIVES)
ENV_FILE = Option(("--env-file",), "the .env file read for hosts and secrets", default=".env")
TRANSPORT = Option(("--transport",), "the data port's protocol, carrying the same frames: tcp (raw socket), websocket "
                   "(binary messages), mqtt (messages through a Mosquitto broker: MQTT_BROKER, MQTT_USERNAME, "
                   "MQTT_PASSWORD in .env), http (HTTP/1.1 bodies on keep-alive connections; stage 1 serves). Both "
                   "stages must agree", default="tcp", choices=TRANSPORTS)
MQTT_QOS = Option(("--mqtt-qos",), "MQTT quality of service of every frame: 0 (at most once) or 1 (at least once, "
                  "acknowledged by the broker)", one_of(("0", "1")), "0", metavar="{0,1}")

# What a run is and how it is driven: the stages, the RPC ranks and the sweep each take these.
SPLIT = Option(("--split",), "block index k: the first k blocks run on stage 1 (0 and K are the baselines)",
               nonneg_int)
SPLIT_BLOCKS = Option(("--split-blocks",), "the block ending each stage but the last, comma-separated, e.g. 5,12 "
                      "(three stages)")
CUT = Option(("--cut",), "fine cut names instead of block indices, comma-separated, one per boundary; a name with + "
             "is a live set of several tensors (paretopipe split --list --fine)")
NUM_BATCHES = Option(("--num-batches",), "measured batches per run", positive_int, 20)
WARMUP = Option(("--warmup",), "extra batches first, excluded from statistics (a language model: short generations "
                "of 2 tokens)", nonneg_int, 3)
IN_FLIGHT = Option(("--in-flight",), "pipelining window: batches outstanding at once (1 = no overlap)",
                   positive_int, 1)
SEED = Option(("--seed",), "seed of the synthetic inputs and seeded prompts", nonneg_int, 0)
EVAL_SAMPLES = Option(("--eval-samples",), "inputs of the run's data that an evaluation pass after the timed batches "
                      "sends through the unsplit float32 model and through the split with this wire dtype: top-1 "
                      "agreement and mean KL divergence, and with a labelled dataset top-1 accuracy beside the unsplit "
                      "model's; a language model's: tokens of --eval-text (or seeded ids), teacher-forced, with each "
                      "one's perplexity (default: 64 where the wire is lossy, 0 where it is float32)",
                      nonneg_int, None)
EVAL_TEXT = Option(("--eval-text",), "a language model's evaluation text (a UTF-8 file on stage 1's host), tokenised "
                   "as its prompts are; its first --eval-samples + 1 tokens are the teacher-forced sequence "
                   "(default: seeded token ids)")
TIMEOUT = Option(("--timeout",), "seconds a run may wait for progress (default: follows the link: 60 s plus what the "
                 "batches in flight need at its slowest rate, with delay, jitter, losses and measured compute)",
                 positive_float)
MAX_BATCH_S = Option(("--max-batch-s",), "a batch slower than this (seconds, end to end) makes the configuration "
                     "infeasible: recorded as such, and the run ends with exit status 0", positive_float)
DEADLINE_MS = Option(("--deadline-ms",), "a result later than this is not waited for: stage 1 finishes the batch "
                     "itself", positive_float)
ENCRYPT = Option(("--encrypt",), "seal every frame of the data port after the handshake (AEAD, keys from "
                 "PARETOPIPE_SECRET); auto: AES-GCM when both CPUs have AES instructions, else ChaCha20-Poly1305",
                 default="none", choices=aead.CHOICES)
DEVICE_PROFILES = Option(("--device-profiles",), "comma list of device profile JSONs (paretopipe profile), one per "
                         "stage in chain order (stage 1 holds the data)")
STAGE_ENGINE_NAMES = tuple(e for e in ENGINES if e not in PEERS)
ENGINE = Option(("--engine",), f"engine each stage computes on ({', '.join(STAGE_ENGINE_NAMES)}): eager PyTorch, or "
                "the stage exported once to ONNX and run by ONNX Runtime or OpenVINO, as edge devices run a CNN",
                default="torch", choices=STAGE_ENGINE_NAMES)
ENGINE_LIST = ENGINE.variant(help=f"comma list of engines ({', '.join(ENGINES)}), each a pass of its own over the "
                             "configurations: eager PyTorch, or each stage exported once to ONNX (cached, checked "
                             "against torch) and run by ONNX Runtime or OpenVINO; llamacpp: a GGUF language model's "
                             "split run by llama.cpp's RPC (scripts/build_llamacpp.sh) through the relay",
                             type=parse_engines, default=["torch"], choices=None)
STAGE_ENGINES = Option(("--stage-engines",), "engine per stage, e.g. onnxruntime,torch (a Pi running ONNX Runtime "
                       "beside a server running PyTorch); overrides --engine")
STAGE_DEVICES = Option(("--stage-devices",), "device per stage, e.g. cpu,cuda")
SAVE_OUTPUTS = Option(("--save-outputs",), "write the returned logits (a language model: the generated token ids, "
                      "key tokens) to this .npz (for checks)")
LOCAL = Option(("--local",), "run every stage as a process on this machine", action="store_true")
MAX_LIVE = Option(("--max-live",), "fine cuts that at most this many tensors cross (a skip connection's, a "
                  "detector's pyramid levels); 1: the block splits only", positive_int, 1)
FINE = Option(("--fine",), "every fx cut instead of the block splits", action="store_true")
STAGES = Option(("--stages",), "stages of each plan (3: two cuts)", positive_int, 2)
# Where conditions come from (the stages, the sweep, netem).
NETWORK = Option(("--network",), "a named network condition from profiles.toml")
NETWORK_FILE = Option(("--network-file",), "a TOML file of named network conditions (the shipped profiles.toml "
                      "when not given)")
TRACE = Option(("--trace",), "a rate trace (Mahimahi or time_s,rate_mbit CSV) instead of a constant rate")
# Files, addresses and what a command writes.
OUT = Option(("--out",), "where the results go")
FORMAT = Option(("--format",), "figure format", default="png", choices=("png", "svg", "pdf"))
OBJECTIVES = Option(("--objectives",), "objectives of the fronts, two or more of latency, throughput, energy, memory, "
                    "energy_stageN, memory_stageN, and a language model's ttft, tpot (energy: measured joules per "
                    "image or token where the stages had sensors, else modelled from declared powers; memory: the "
                    "largest stage's parameters and activation, a language model's KV cache)")
HOST = Option(("--host",), "an address to listen on or connect to")
PORT = Option(("--port",), "a TCP port", port_number)
DRY_RUN = Option(("--dry-run",), "print what would be done; change and run nothing", action="store_true")
STUDY = Option(("--study",), "a search study shared by workers, each on its own testbed: journal:PATH or "
               "postgresql://USER@HOST/DB", metavar="URL")

# Language models (paretopipe.llm): the stages, the chains and split --list.
MODEL_DIR = Option(("--model-dir",), "a decoder-only LM's trained weights, as from_pretrained takes them: a folder "
                   "(config.json, *.safetensors, tokenizer.json), a Hugging Face hub id (its local cache; fetched only "
                   "without HF_HUB_OFFLINE), or a .gguf file (dequantised once, tokenizer and chat template from the "
                   "file)")
PROMPT = Option(("--prompt",), "the prompt text (every stream the same; tokenizer.json, else bytes)")
PROMPT_LEN = Option(("--prompt-len",), "a seeded prompt of N tokens per stream (default 16 without --prompt)",
                    positive_int)
GEN_TOKENS = Option(("--gen-tokens",), "tokens generated per stream (the prefill gives the first)", positive_int, 16)
STREAMS = Option(("--streams",), "concurrent sequences in flight (S > 1 fills the pipeline's bubble)", positive_int, 1)
TEMPERATURE = Option(("--temperature",), "0: greedy; else sampled at this temperature, seeded by (seed, stream, "
                     "step)", nonneg_float, 0.0)
TOP_K = Option(("--top-k",), "with --temperature: sample among the k largest (0: all)", nonneg_int, 0)
CHECK_EXACT = Option(("--check-exact",), "the last stage compares its logits with the unsplit float32 model's after "
                     "the run (always for a lossy --wire-dtype); it then builds the whole model once")
CHAT = Option(("--chat",), "put --prompt through the model's chat template as a user's turn (tokenizer_config.json "
              "or chat_template.jinja of the model's folder or GGUF), then generate the assistant's reply")
#: A generation's settings (a language model's workload): refused for an image model.
GENERATION_FLAGS = (MODEL_DIR, PROMPT, PROMPT_LEN, GEN_TOKENS, STREAMS, TEMPERATURE, TOP_K)
# Modelled energy: declared powers, one value per stage (predict, the language-model runs; the sweep's table
# reads the same texts).
POWER_IDLE_W = Option(("--power-idle-w",), "watts per stage, e.g. 2.7,45: each device's idle power, for the modelled "
                      "energy", watts_per_stage)
POWER_CORE_W = Option(("--power-core-w",), "watts per stage, e.g. 0.9,15: what one busy core adds; x the stage's "
                      "compute seconds = its modelled energy", watts_per_stage)
# The language-model sweep's dimensions: the same flags as a comma list, each value a configuration.
PROMPT_LENS = PROMPT_LEN.variant(help="seeded prompt lengths, a comma list (128,1024)",
                                 type=list_of(positive_int, "positive_int_list"), default=[16])

# MLPerf LoadGen scenarios (paretopipe.loadgen): the data source runs LoadGen over the pipeline.
SCENARIO = Option(("--scenario",), "MLPerf LoadGen scenario driving the pipeline from stage 1: singlestream (one "
                  "sample at a time: p90), multistream (queries of --samples-per-query: p99), offline (every sample at "
                  "once: samples/s), server (Poisson arrivals: the highest rate whose p99 stays within "
                  "--latency-bound-ms)", choices=SCENARIOS)
SCENARIOS_LIST = SCENARIO.variant(help=f"comma list of MLPerf LoadGen scenarios ({', '.join(SCENARIOS)}), each a "
                                  f"configuration of its own; {CLOSED_LOOP} is the suite's own closed loop (the default)",
                                  type=list_of(one_of((CLOSED_LOOP,) + SCENARIOS), "scenario_list"),
                                  default=[CLOSED_LOOP], choices=None)
MLPERF_COMPLIANT = Option(("--mlperf-compliant",), "apply the MLPerf edge rules (600 s a run, each scenario's "
                          "minimum queries) and refuse settings below them; without it a run is short and recorded as "
                          "not MLPerf-compliant")
MIN_DURATION_S = Option(("--min-duration-s",), f"LoadGen's minimum test duration, seconds (unset: {SHORT_MIN_DURATION_S:g}, or "
                        f"{COMPLIANT_MIN_DURATION_S:g} with --mlperf-compliant)", positive_float)
MIN_QUERY_COUNT = Option(("--min-query-count",), f"LoadGen's minimum queries (Offline: samples; unset: "
                         f"{SHORT_MIN_QUERIES}, or the edge rules' with --mlperf-compliant)", positive_int)
LATENCY_BOUND_MS = Option(("--latency-bound-ms",), "server: the bound on the 99th-percentile latency the rate "
                          "search keeps within, ms", positive_float, 100.0)
TTFT_MS = Option(("--ttft-ms",), "server, a language model: the bound on the 99th-percentile time to first token, "
                 "ms (unset: 2000, MLPerf's for Llama 2 70B)", positive_float)
TPOT_MS = Option(("--tpot-ms",), "server, a language model: the bound on the 99th-percentile time per output token "
                 "after the first, ms (unset: 200)", positive_float)
SERVER_QPS = Option(("--server-qps",), "server: run at this Poisson rate (queries/s) instead of searching for the "
                    "highest within the bound", positive_float)
SERVER_STEPS = Option(("--server-steps",), "server: LoadGen runs the rate search may take", positive_int, 7)
LOADGEN_MODE = Option(("--loadgen-mode",), "performance, or accuracy: every sample of a labelled dataset "
                      "(--dataset imagefolder:PATH or cifar10:PATH) once, top-1 against its labels", default="performance",
                      choices=MODES)
SAMPLE_COUNT = Option(("--sample-count",), "LoadGen's performance sample count: distinct inputs held in memory",
                      positive_int, 64)
SAMPLES_PER_QUERY = Option(("--samples-per-query",), "multistream: samples in one query", positive_int, 8)
EXPECTED_QPS = Option(("--expected-qps",), "offline: the rate LoadGen sizes its one query by (unset: the warm-up's "
                      "rate x 1.5)", positive_float)
#: Every LoadGen setting but the scenario and --mlperf-compliant (a switch): the LoadgenOptions field each sets.
LOADGEN_VALUES = ((MIN_DURATION_S, "min_duration_s"), (MIN_QUERY_COUNT, "min_query_count"),
                  (LATENCY_BOUND_MS, "latency_bound_s"), (TTFT_MS, "ttft_bound_s"), (TPOT_MS, "tpot_bound_s"),
                  (SERVER_QPS, "server_qps"), (SERVER_STEPS, "server_steps"),
                  (LOADGEN_MODE, "mode"), (SAMPLE_COUNT, "sample_count"), (SAMPLES_PER_QUERY, "samples_per_query"),
                  (EXPECTED_QPS, "expected_qps"))


#: The LoadGen settings given in milliseconds and kept in seconds.
MS_FIELDS = ("latency_bound_s", "ttft_bound_s", "tpot_bound_s")


def loadgen_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The LoadGen settings of parsed flags (``LoadgenOptions.of_flags``'s keywords but the scenario)."""
    out: dict[str, Any] = {"compliant": bool(getattr(args, "mlperf_compliant", False))}
    for row, field in LOADGEN_VALUES:
        value = getattr(args, row.name, None)
        out[field] = value / 1e3 if value is not None and field in MS_FIELDS else value
    return out


def option(row: Option, *, required: bool = False) -> Any:
    """A :class:`CommandLine` field written and parsed as ``row``, with the row's default."""
    return dataclasses.field(metadata={"option": row}, **({} if required else {"default": row.default}))


C = TypeVar("C", bound="CommandLine")


class CommandLine:
    """A process's command line as one dataclass: :meth:`to_argv` writes it, :meth:`parse` reads
    it back. A field's flag is its catalogue row's (:func:`option`), else ``--field-name``; its
    type comes from the row or the annotation; a field without a default is required."""

    @classmethod
    def _options(cls) -> list[tuple[dataclasses.Field, Option]]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            row = f.metadata.get("option")
            if row is None:
                row = Option((f"--{f.name.replace('_', '-')}",), type=_value_type(hints[f.name]))
            out.append((f, row))
        return out

    def to_argv(self) -> list[str]:
        """``--flag value`` for every field that has a value (None: left out)."""
        out: list[str] = []
        for f, row in self._options():
            value = getattr(self, f.name)
            if value is not None:
                out += [row.flags[0], repr(value) if isinstance(value, float) else str(value)]
        return out

    @classmethod
    def parser(cls, prog: str, description: str) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=prog, description=description)
        for f, row in cls._options():
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            row.add_to(p, dest=f.name, required=required,
                       **({} if required else {"default": f.default}))
        return p

    @classmethod
    def parse(cls: type[C], argv: Sequence[str] | None, prog: str, description: str) -> C:
        return cls(**vars(cls.parser(prog, description).parse_args(argv)))


def _value_type(hint: Any) -> Callable[[str], Any] | None:
    """int, float or text (None) from a field's annotation, ``X | None`` included."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint if hint in (int, float) else None


@dataclasses.dataclass(kw_only=True)
class ModelProcess(CommandLine):
    """What every stage process (a TCP stage worker, an RPC rank) is started with: the model it
    builds, its weights, and where and on how many threads it computes."""

    model: str = option(MODEL, required=True)
    model_dir: str | None = option(MODEL_DIR)
    num_classes: int = option(NUM_CLASSES)
    weights: str | None = option(WEIGHTS)
    models_dir: str | None = option(MODELS_DIR)
    device: str = option(DEVICE)
    threads: int | None = option(THREADS)
    cpus: str | None = option(CPUS)
