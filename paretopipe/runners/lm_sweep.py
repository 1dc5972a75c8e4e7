"""A language-model sweep on this machine: every split of a decoder-only LM under every network
condition and prompt length, two stages, each configuration measured ``runs`` times.

Stage 1 runs in this process (pinned to the first CPU), the later stage in a process of its own
(the second CPU) that stays connected for the whole sweep: a run is a RUN on the same
authenticated connection, and each stage rebuilds only when the split changes. Every run's
record lands in ``SESSION/runs/`` as it completes and ``summary.csv`` is rewritten after each
configuration, so a stopped sweep keeps everything measured. A configuration whose stage would
hold more than ``--memory-limit`` (its parameters and its KV cache at the full context) is
recorded as infeasible and not run."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .. import records
from ..analysis import lm_fronts
from ..analysis.session import sweep_session_dir
from ..llm import shapes
from ..llm.tokens import prompt_ids, tokenizer_for
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions, get_conditions
from ..splits import parse_splits

log = logging.getLogger("paretopipe.sweep")
STAGE2_START_S = 120.0


@dataclasses.dataclass
class LMSweepOptions:
    model: str | None
    model_dir: str | None
    splits: str  # as --splits writes them: all, 1,4,8, 2-10
    networks: list[str]
    prompt_lens: list[int]
    gen_tokens: int = 16
    streams: int = 1
    cut_dtypes: list[str] = dataclasses.field(default_factory=lambda: ["float32"])
    runs: int = 1
    out: str = "results"
    session: str | None = None
    network_file: str | None = None
    seed: int = 0
    warmup: int = 1
    threads: int = 1
    memory_limits: dict[str, int] = dataclasses.field(default_factory=dict)  # stage1/stage2 -> bytes
    timeout_s: float | None = None
    power_idle_w: list[float] | None = None
    power_core_w: list[float] | None = None


@dataclasses.dataclass(frozen=True)
class LMConfig:
    network: str
    prompt_len: int
    cut_dtype: str
    split: int

    @property
    def key(self) -> str:
        return f"{self.network}_p{self.prompt_len}_{self.cut_dtype}_s{self.split:02d}"


def plan(opts: LMSweepOptions, splits: list[int]) -> list[LMConfig]:
    """Splits outermost: each stage is built once per split (the emulated link changes from one
    run to the next for free), then networks, prompt lengths and dtypes."""
    return [LMConfig(n, p, d, k) for k in splits for n in opts.networks for p in opts.prompt_lens
            for d in opts.cut_dtypes]


def stage_memory_bytes(shape: shapes.LMShape, split: int, index: int, context: int, streams: int) -> int:
    """What stage ``index`` of a two-stage split holds: parameters and every stream's KV cache."""
    params = shapes.block_params(shape)
    first, end = shapes.stage_blocks(shape, [split], index)
    held = sum(params[first:end]) - (params[-1] if first == 0 and end == len(params) and shape.tie_word_embeddings
                                     else 0)
    layers = len(shapes.stage_layers(shape, [split], index))
    return 4 * held + shape.kv_bytes_per_token(layers) * context * streams


def infeasible_why(opts: LMSweepOptions, shape: shapes.LMShape, cfg: LMConfig) -> str | None:
    context = cfg.prompt_len + opts.gen_tokens
    for index in (0, 1):
        limit = opts.memory_limits.get(f"stage{index + 1}")
        need = stage_memory_bytes(shape, cfg.split, index, context, opts.streams)
        if limit is not None and need > limit:
            return (f"stage {index + 1} needs {need / 1e6:.1f} MB (parameters and KV cache at {context} tokens) "
                    f"> its --memory-limit {limit / 1e6:g} MB")
    return None


class LMSweep:
    def __init__(self, opts: LMSweepOptions) -> None:
        # lazy for start-up: torch, transformers
        from ..llm.build import source

        self.opts = opts
        self.src = source(None if opts.model_dir else opts.model, opts.model_dir)
        self.shape = self.src.shape
        self.splits = parse_splits(opts.splits, self.shape.last_split)
        self.conditions: dict[str, NetworkConditions | None] = {
            n: (None if n == "unshaped" else get_conditions(n, opts.network_file)) for n in opts.networks}
        self.tokenizer = tokenizer_for(opts.model_dir)
        for p in opts.prompt_lens:
            prompt_ids(None, p, self.shape.vocab_size, self.shape.max_position_embeddings, opts.gen_tokens,
                       self.tokenizer, opts.seed, 0)
        self.session = sweep_session_dir(opts.out, opts.session, resume=False)
        self.rows: list[dict[str, Any]] = []
        self.runs_done = 0

    def run(self) -> Path:
        import torch  # lazy for start-up: torch

        # lazy for start-up: torch
        from ..transport import tcp
        # lazy for start-up: torch
        from ..transport.lmrun import LMStages
        # lazy for start-up: torch
        from ..transport.tcp.lm import LMIdentity

        (self.session / "runs").mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(self.opts.threads)
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            os.sched_setaffinity(0, {cpus[0]})
        listener = tcp.StageListener(tcp.listen("127.0.0.1", 0), LMIdentity.of(self.src).as_dict())
        stage2 = self._start_stage2(listener.port, cpus[1] if len(cpus) >= 2 else None)
        started = time.monotonic()
        self._write_meta(started)
        connection = None
        try:
            connection = listener.connection(STAGE2_START_S)
            stages = LMStages(self.src)
            for cfg in plan(self.opts, self.splits):
                self._configuration(connection, stages, cfg)
                self._write_meta(started)
            connection.close(bye=True)
            connection = None
        finally:
            if connection is not None:
                connection.close()
            listener.close()
            try:
                stage2.wait(30)
            except subprocess.TimeoutExpired:
                stage2.send_signal(signal.SIGTERM)
                stage2.wait(10)
            os.sched_setaffinity(0, set(cpus))
        return self.session

    def _start_stage2(self, port: int, cpu: int | None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "paretopipe", "stage2", "--host", "127.0.0.1", "--port", str(port),
                "--threads", str(self.opts.threads), "--quiet", "--connect-timeout", str(STAGE2_START_S)]
        argv += ["--model-dir", self.opts.model_dir] if self.opts.model_dir else ["--model", self.src.name]
        log.info("starting the later stage: %s", " ".join(argv))
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)

    def _configuration(self, connection, stages, cfg: LMConfig) -> None:
        # lazy for start-up: torch
        from ..transport.lmrun import LMRunConfig, run_timeout_s
        # lazy for start-up: torch
        from ..transport.tcp.lm import run_lm

        why = infeasible_why(self.opts, self.shape, cfg)
        if why is not None:
            log.info("%s: infeasible (%s)", cfg.key, why)
            self._row({"model": self.src.name, "network": cfg.network, "prompt_len": cfg.prompt_len,
                       "gen_tokens": self.opts.gen_tokens, "streams": self.opts.streams, "cut_dtype": cfg.cut_dtype,
                       "split": str(cfg.split), "status": "infeasible", "runs": 0, "note": why})
            return
        conditions = self.conditions[cfg.network]
        prompts = [prompt_ids(None, cfg.prompt_len, self.shape.vocab_size, self.shape.max_position_embeddings,
                              self.opts.gen_tokens, self.tokenizer, self.opts.seed, s) for s in range(self.opts.streams)]
        timeout = self.opts.timeout_s or run_timeout_s(self.shape, conditions, cfg.prompt_len, cfg.split, cfg.cut_dtype,
                                                       self.opts.streams)
        run_cfg = LMRunConfig(model=self.src.name, identity=self.src.identity(), splits=[cfg.split],
                              gen_tokens=self.opts.gen_tokens, streams=self.opts.streams,
                              prompt_tokens=[len(p) for p in prompts], cut_dtype=cfg.cut_dtype, seed=self.opts.seed,
                              warmup=self.opts.warmup, timeout_s=timeout, check_exact=cfg.cut_dtype != "float32",
                              power_idle_w=self.opts.power_idle_w, power_core_w=self.opts.power_core_w,
                              network=None if conditions is None else cfg.network)
        recs = []
        for r in range(self.opts.runs):
            outcome = run_lm(connection, stages, run_cfg, prompts, conditions=conditions,
                             output_dir=self.session / "runs", threads=self.opts.threads,
                             run_id=f"{cfg.key}_r{r}")
            recs.append(outcome.record)
            self.runs_done += 1
            s = outcome.record["summary"]
            log.info("%s run %d: ttft %.2f ms, time per token %.2f ms", cfg.key, r,
                     s["ttft_median_s"] * 1e3, s["tpot_median_s"] * 1e3)
        row = lm_fronts.summarize_config(recs)
        row["network"] = cfg.network
        self._row(row)

    def _row(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        lm_fronts.write_summary(self.session, [dict(r) for r in self.rows])

    def _write_meta(self, started: float) -> None:
        records.atomic_write_json(self.session / lm_fronts.SESSION_FILE, {
            "kind": "llm", "options": dataclasses.asdict(self.opts), "model": self.src.name,
            "identity": self.src.identity(), "shape": dataclasses.asdict(self.shape),
            "conditions": {n: (c.to_dict() if c else None) for n, c in self.conditions.items()},
            "configurations": len(plan(self.opts, self.splits)), "runs_done": self.runs_done,
            "elapsed_s": time.monotonic() - started, "manifest": node_manifest("cpu", self.opts.threads,
                                                                                 role="controller+stage1")})

