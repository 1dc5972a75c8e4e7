"""The run configuration: one typed object that both stages, the worker protocol and the record share.

It travels as JSON (worker commands, the TCP handshake, RPC), so :meth:`RunConfig.from_dict`
refuses an unknown, missing or mistyped key by name instead of dropping it: a renamed field
fails loudly. The record's ``config`` is exactly :meth:`RunConfig.to_dict`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import engines, strict, workload
from ..errors import UsageError
from ..faults import Fault
from ..splitspec import POLICIES
from ..workload import Workload
from ..partition.names import DEFAULT_NUM_CLASSES
from ..loadgen.settings import LoadgenOptions
from ..wiredtype import AUTO, WIRE_DTYPE_CHOICES, WIRE_DTYPE_NAMES
from .inputs import check_dataset

LINK_MODES = ("none", "emulated", "tc")
#: How activations may travel (``wire`` holds their codes and torch dtypes): named here, torch-free,
#: so a command can list them in its --help without importing torch.
COMPRESSIONS = ("none", "zstd", "lz4")
#: The largest frame payload a stage accepts by default (``--max-payload``).
DEFAULT_MAX_PAYLOAD = 1 << 30  # 1 GiB
OBJECTIVES = ("latency", "throughput")
#: The datasets whose images carry labels (LoadGen's accuracy mode scores against them).
LABELLED_DATASETS = ("imagefolder", "cifar10")
#: The energy sampler's fastest rate: sensors update at 10-100 Hz (a Pi 5's PMIC read takes ms).
MAX_ENERGY_RATE_HZ = 1000.0


#: A generation's warm-up: each warm-up stream generates this many tokens from its prompt's first
#: WARMUP_PROMPT_TOKENS, so every stage's first calls (prefill and decode) are paid before the measured streams.
WARMUP_TOKENS = 2
WARMUP_PROMPT_TOKENS = 8
DEFAULT_PROMPT_LEN = 16


def eval_samples_for(requested: int | None, wire_dtype: str) -> int:
    """How many samples a run's fidelity pass evaluates (paretopipe.transport.fidelity): as asked,
    else 64 where the wire is lossy and none where it is float32, which is exact."""
    if requested is not None:
        return requested
    return 64 if wire_dtype != "float32" else 0


@dataclasses.dataclass(frozen=True)
class Generation:
    """A language model's workload: every stream's prompt (a seeded one of ``prompt_len`` tokens,
    or the same ``prompt`` text for every stream), then ``gen_tokens`` tokens one at a time, the
    last stage's token fed back to stage 1 (greedy, or sampled at ``temperature`` among the
    ``top_k`` largest, seeded). ``streams`` sequences are in flight at once. ``warmup_streams``
    short generations run first, unmeasured. With ``check_exact`` (always for a lossy wire dtype)
    the last stage compares its logits with the unsplit float32 model's after the run."""

    gen_tokens: int = 16
    streams: int = 1
    prompt_len: int | None = None
    prompt: str | None = None
    temperature: float = 0.0
    top_k: int = 0
    check_exact: bool = False
    warmup_streams: int = 1
    chat: bool = False  # the prompt goes through the model's chat template, as a user's turn

    def __post_init__(self) -> None:
        if self.prompt is not None and self.prompt_len is not None:
            raise UsageError("give --prompt TEXT or --prompt-len N, not both")
        if self.chat and self.prompt is None:
            raise UsageError("--chat applies the model's chat template to --prompt TEXT; give one")
        if self.prompt is None and self.prompt_len is None:
            object.__setattr__(self, "prompt_len", DEFAULT_PROMPT_LEN)
        for name in ("gen_tokens", "streams"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.prompt_len is not None and self.prompt_len < 1:
            raise UsageError(f"--prompt-len {self.prompt_len}: must be at least 1")
        if not self.temperature >= 0:
            raise UsageError(f"--temperature {self.temperature:g}: 0 (greedy) or more")
        if self.top_k < 0 or self.warmup_streams < 0:
            raise UsageError("--top-k and the warm-up streams must be 0 or more")

    @property
    def steps(self) -> int:
        """The measured steps (one token each): every stream's prefill and decode steps."""
        return self.streams * self.gen_tokens

    @property
    def warmup_steps(self) -> int:
        return self.warmup_streams * WARMUP_TOKENS


RPC_TRANSPORTS = ("uv", "auto")
RPC_SOURCES = ("master", "stage1")


@dataclasses.dataclass(frozen=True)
class RpcOptions:
    """The RPC backend's own settings (a TCP run has none): the TensorPipe transport, where the
    data lives (the master alone, or the master computing stage 1), whether batches overlap, the
    world's ranks, and the stages (set from the cuts by :class:`RunConfig`)."""

    transport: str = "uv"
    source: str = "master"
    use_pipelining: bool = False
    world_size: int | None = None
    num_partitions: int | None = None

    def __post_init__(self) -> None:
        if self.transport not in RPC_TRANSPORTS:
            raise UsageError(f"--rpc-transport {self.transport!r}: valid {', '.join(RPC_TRANSPORTS)}")
        if self.source not in RPC_SOURCES:
            raise UsageError(f"--rpc-source {self.source!r}: valid {', '.join(RPC_SOURCES)}")


@dataclasses.dataclass(frozen=True)
class AdaptiveOptions:
    """The adaptive split's settings (split_index "adaptive"): what it optimises, the splits it may
    choose (None: every block split; block indices, and cuts of several tensors by name) and the
    device profiles (paths on stage 1's host; None: both stages profile themselves at start).

    Both policies watch each stage's per-segment compute: a sliding ``window`` of batches and an
    EMA (weight ``ema_alpha`` on the newest), and a segment whose coefficient of variation over
    the window exceeds ``cv_threshold`` is re-profiled with its successor. ``local_probability``
    is SCIoT's: the chance that a batch is forced whole onto stage 1 to refresh its times (the
    sciot policy only). The defaults are SCIoT's (Bove and Bedogni; its code's example setting
    for the probability)."""

    objective: str = "latency"
    candidates: list[int | str] | None = None
    device_profiles: list[str] | None = None
    ema_alpha: float = 0.2
    cv_threshold: float = 0.15
    window: int = 10
    local_probability: float = 0.1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UsageError(f"--objective {self.objective!r}: valid {', '.join(OBJECTIVES)}")
        if not 0 < self.ema_alpha <= 1:
            raise UsageError(f"--ema-alpha {self.ema_alpha:g}: valid (0, 1], the newest sample's weight")
        if not self.cv_threshold > 0:
            raise UsageError(f"--cv-threshold {self.cv_threshold:g}: give a coefficient of variation above 0, e.g. 0.15")
        if not 3 <= self.window <= 1000:
            raise UsageError(f"--variance-window {self.window}: valid 3..1000 batches")
        if not 0 <= self.local_probability <= 1:
            raise UsageError(f"--local-probability {self.local_probability:g}: valid 0..1")
        if self.device_profiles is not None and len(self.device_profiles) != 2:
            raise UsageError(f"--device-profiles: give two profiles (stage 1's, stage 2's), got "
                             f"{len(self.device_profiles)}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One measured run of one split: the core every run has, and the options of the RPC backend
    (``rpc``) and of the adaptive split (``adaptive_split``) apart. Both stages must agree on the
    fields the handshake checks. Frozen, and never patched on its way: what a stage needs beside
    it (stage 2's own --timeout) it keeps beside it, so every stage's record has the same copy."""

    model: str
    cuts: list[str]
    split_index: int | list[int] | str | None = None   # k, an N-stage plan, a cut's name, or "adaptive"
    batch_size: int = 8
    num_batches: int = 20
    warmup: int = 3
    in_flight: int = 1
    dataset: str = "synthetic"
    prefetch_batches: int = 0   # the anchor's --enable-prefetch: batches prepared ahead in a thread (0: none)
    data_dir: str | None = None
    num_classes: int = DEFAULT_NUM_CLASSES
    wire_dtype: str = "float32"
    compression: str = "none"
    compression_level: int = 3
    seed: int = 0
    # Inputs of an evaluation pass after the timed batches: the split with this wire against the
    # unsplit float32 model (paretopipe.transport.fidelity); 0: none.
    eval_samples: int = 0
    # A language model's evaluation text (a file on stage 1's host; None: seeded token ids).
    eval_text: str | None = None
    # --wire-dtype auto: the share of the unsplit model's top-1 (or of its accuracy, on labelled data)
    # the chosen dtype must keep; and, once stage 1 chose, the evidence (transport.fidelity.chosen).
    fidelity_target: float | None = None
    wire_choice: dict[str, Any] | None = None
    network: str | None = None
    link_mode: str = "none"
    network_delay_ms_label: float | None = None
    timeout_s: float = 60.0
    # The user's bound on one batch's latency: a batch past it ends the run as "infeasible".
    max_batch_s: float | None = None
    # Set by the sweeper before the run starts, so the record is never patched afterwards.
    run_key: str | None = None
    config_key: str | None = None
    run: int | None = None
    stage_limits: dict[str, Any] | None = None
    # After this long a result is not waited for: stage 1 finishes the batch itself (one batch in
    # flight; an adaptive run, or a static one that asks for the fallback).
    deadline_s: float | None = None
    rpc: RpcOptions | None = None
    adaptive_split: AdaptiveOptions | None = None
    # Energy and memory (paretopipe.energy): how often each stage reads its power sensors, each
    # stage's declared idle power and the power one busy core adds (the modelled energy of a host
    # without sensors), and each stage's memory limit in bytes (a stage over it is marked).
    energy_rate_hz: float = 10.0
    power_idle_w: list[float | None] | None = None
    power_core_w: list[float | None] | None = None
    memory_limits: list[int | None] | None = None
    # An MLPerf LoadGen scenario drives the run (paretopipe.loadgen): the batches are its queries,
    # as many as it issues; num_batches is then unused.
    loadgen: LoadgenOptions | None = None
    # A language model's generation (the workload's other kind): its steps are the run's batches.
    generation: Generation | None = None
    # A fault stage 1 survives by its deadline (paretopipe.faults): a sweep's treatment.
    fault: Fault | None = None
    # The testbed's hosts the stages ran on, in order (analysis.keys.placement_label): a sweep's
    # --placements; None: the first hosts in .env's order, or this machine.
    placement: str | None = None
    # The engine each stage computes on (paretopipe.engines): one for all, or one per stage joined by "+".
    engine: str = engines.TORCH

    def __post_init__(self) -> None:
        if self.wire_dtype not in WIRE_DTYPE_CHOICES:
            raise UsageError(f"--wire-dtype {self.wire_dtype!r}: valid {', '.join(WIRE_DTYPE_NAMES)}, auto")
        if self.fidelity_target is not None and not 0 < self.fidelity_target <= 1:
            raise UsageError(f"--fidelity-target {self.fidelity_target}: a share of the unsplit model's top-1 in (0, 1]")
        if self.wire_dtype == AUTO and self.fidelity_target is None:
            raise UsageError("--wire-dtype auto needs --fidelity-target, the share of the unsplit model's top-1 "
                             "(or accuracy) to keep, e.g. 0.99")
        if self.workload.generates:
            self._derive_generation()
        if self.eval_samples < 0:
            raise UsageError(f"--eval-samples {self.eval_samples}: must be 0 or more")
        for name in ("batch_size", "in_flight"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        for name in ("num_batches", "warmup", "prefetch_batches"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be 0 or more")
        if self.num_batches + self.warmup < 1:
            raise UsageError("--num-batches and --warmup together must give at least one batch")
        if self.num_classes < 1:
            raise UsageError(f"--num-classes {self.num_classes}: must be at least 1")
        if not self.timeout_s > 0:
            raise UsageError(f"--timeout {self.timeout_s:g}: must be positive (seconds)")
        if self.max_batch_s is not None and not self.max_batch_s > 0:
            raise UsageError(f"--max-batch-s {self.max_batch_s:g}: must be positive (seconds)")
        self._check_split()
        self._check_measures()
        self._check_engine()

    def _check_engine(self) -> None:
        """Engines other than torch run an image model's split, static or adaptive, over the TCP
        backend; the llama.cpp peer a language model's static split (a server per stage after the first)."""
        engines.check_label(self.engine, len(self.cuts) + 1)
        if engines.only_torch(self.engine):
            return
        why = self._peer_refusal() if engines.is_peer(self.engine) else self.workload.refusal("engines") or \
            ("the RPC backend's ranks run torch modules; use --backend tcp" if self.rpc is not None else None)
        if why:
            raise UsageError(f"--engine {self.engine}: {why}, or --engine torch")

    def _peer_refusal(self) -> str | None:
        return self.workload.refusal("llamacpp") or (
                "llama.cpp's peer is its own RPC, not the rpc backend's ranks" if self.rpc is not None
                else "llama.cpp's split is fixed when its client loads; give a static split" if self.adaptive
                else None)

    def _check_split(self) -> None:
        """The link, the split and what a policy or a deadline allows of it."""
        if self.link_mode not in LINK_MODES:
            raise UsageError(f"link mode {self.link_mode!r}: valid {', '.join(LINK_MODES)}")
        if isinstance(self.split_index, str) and self.split_index not in POLICIES and \
                (len(self.cuts) != 1 or self.split_index != self.cuts[0]):
            raise UsageError(f"split {self.split_index!r}: a block index k, the run's one cut, or a policy "
                             f"({', '.join(POLICIES)})")
        if self.adaptive and self.in_flight != 1:
            raise UsageError(f"--in-flight {self.in_flight}: the adaptive runtime keeps one batch in flight "
                             f"(it switches splits at batch boundaries); use --in-flight 1")
        if self.deadline_s is not None and self.in_flight != 1:
            raise UsageError(f"--deadline-ms with --in-flight {self.in_flight}: a deadline settles each batch "
                             f"before the next; use --in-flight 1")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise UsageError(f"--deadline-ms {self.deadline_s * 1e3:g}: must be positive")
        if self.fault is not None and (self.deadline_s is None or self.rpc is not None):
            raise UsageError(f"--fault {self.fault.label}: stage 1 survives a fault by finishing batches itself, "
                             f"which needs --deadline-ms and the TCP backend")
        if self.fault is not None and self.fault.at_batch >= self.num_batches:
            raise UsageError(f"--fault {self.fault.label}: batch {self.fault.at_batch} is past the run's "
                             f"{self.num_batches} measured batches (valid 0..{self.num_batches - 1})")
        if self.adaptive and self.adaptive_split is None:
            object.__setattr__(self, "adaptive_split", AdaptiveOptions())
        elif self.adaptive_split is not None and not self.adaptive:
            raise UsageError(f"adaptive split options for split {self.split_index!r}: they apply to "
                             f"{' and '.join(POLICIES)} only")

    def _check_measures(self) -> None:
        """Energy and memory settings, the cuts' stages over RPC, LoadGen's and the dataset's."""
        if not 0 < self.energy_rate_hz <= MAX_ENERGY_RATE_HZ:
            raise UsageError(f"--energy-rate-hz {self.energy_rate_hz:g}: give a rate in (0, {MAX_ENERGY_RATE_HZ}] Hz")
        for name in ("power_idle_w", "power_core_w", "memory_limits"):
            if any(v is not None and v < 0 for v in getattr(self, name) or []):
                raise UsageError(f"{name}: {getattr(self, name)}: every value must be 0 or more")
        if not self.cuts:
            raise UsageError("a run needs at least one cut")
        if self.rpc is not None:
            # An RPC run's stage count follows from its cuts: set once here, so nothing patches it later.
            if self.rpc.num_partitions is None:
                object.__setattr__(self, "rpc", dataclasses.replace(self.rpc, num_partitions=len(self.cuts) + 1))
            elif self.rpc.num_partitions != len(self.cuts) + 1:
                raise UsageError(f"num_partitions {self.rpc.num_partitions}: {len(self.cuts)} cut(s) make "
                                 f"{len(self.cuts) + 1} stages")
        if self.loadgen is not None and (self.adaptive or self.deadline_s is not None):
            raise UsageError(f"--scenario {self.loadgen.scenario} with "
                             f"{'--split ' + str(self.split_index) if self.adaptive else '--deadline-ms'}: a LoadGen "
                             f"run keeps a static split and waits for every result; give a block split")
        bounds = self.loadgen is not None and (self.loadgen.ttft_bound_s is not None or
                                                self.loadgen.tpot_bound_s is not None)
        self.workload.refuse(token_bounds=bounds, eval_text=self.eval_text is not None)
        if self.loadgen is not None and self.loadgen.mode == "accuracy" and \
                self.dataset.split(":")[0] not in LABELLED_DATASETS:
            raise UsageError(f"--loadgen-mode accuracy needs labelled inputs: give --dataset imagefolder:PATH or "
                             f"cifar10:PATH, not {self.dataset}")
        check_dataset(self.dataset)

    def _derive_generation(self) -> None:
        """A generation's batches are its steps, one token of one stream each: the batch size, the
        window, the measured and warm-up batches follow from it (set once here, never patched)."""
        g = self.generation
        if self.adaptive or self.dataset != "synthetic":
            what = "--split " + str(self.split_index) if self.adaptive else f"--dataset {self.dataset}"
            raise UsageError(f"{what} applies to an image model's batches; a language model runs a static split "
                             f"over its prompts")
        if self.deadline_s is not None and (g.streams != 1 or self.loadgen is not None):
            raise UsageError(f"--deadline-ms with {'--scenario' if self.loadgen is not None else f'--streams {g.streams}'}"
                             f": a deadline settles one step at a time; use --streams 1 and the closed loop (no "
                             f"--scenario)")
        # Under LoadGen the streams are slots that queries take in turn, and the warm-up is whole
        # queries, each slot's worth per warm-up stream (their rate sizes LoadGen's expectations).
        warmup = g.warmup_streams * g.streams * g.gen_tokens if self.loadgen is not None else g.warmup_steps
        for name, value in (("batch_size", 1), ("in_flight", g.streams), ("num_batches", g.steps),
                            ("warmup", warmup)):
            object.__setattr__(self, name, value)
        if self.loadgen is not None:
            object.__setattr__(self, "loadgen", self.loadgen.for_tokens())
            # The exactness check compares fixed streams step by step; a LoadGen run's queries come
            # and go (a lossy wire's cost is --eval-samples' teacher-forced perplexity).
            object.__setattr__(self, "generation", dataclasses.replace(g, check_exact=False))
        elif self.deadline_s is not None:
            # A step finished on stage 1 leaves the last stage no logits to compare (a stage 2
            # started again after a kill has none of the earlier steps either).
            object.__setattr__(self, "generation", dataclasses.replace(g, check_exact=False))
        elif self.wire_dtype != "float32" and not g.check_exact:
            object.__setattr__(self, "generation", dataclasses.replace(g, check_exact=True))

    @property
    def workload(self) -> Workload:
        """Image batches, or a language model's generation (its ``generation`` settings)."""
        return workload.of_generation(self.generation)

    @property
    def adaptive(self) -> bool:
        """The split is chosen per batch by a policy (``adaptive`` or ``sciot``)."""
        return isinstance(self.split_index, str) and self.split_index in POLICIES

    def to_dict(self) -> dict[str, Any]:
        return strict.to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, what: str = "run configuration") -> "RunConfig":
        return strict.from_dict(cls, data, what)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)
