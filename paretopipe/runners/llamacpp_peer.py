"""llama.cpp's RPC split as a sweep's stage group (``--engine llamacpp``): ``ggml-rpc-server`` as
stage 2, ``llama-server --rpc`` as stage 1, and between them a :class:`~paretopipe.network.relay.
LinkRelay` that gives llama.cpp's connections each run's link and counts what crosses. A run is a
generation of the sweep's streams, its prompts the same token ids our engine gets, timed on this
process's clock as each token streams in; its record has our engine's columns, each step carrying
the bytes each way and the round trips the relay counted since the step before.

Stage 1 is started again for each split (``-ngl`` is fixed at load), with the link unshaped while
it loads (its offloaded weights cross once, not per token); stage 2 and the relay live as long as
the group. Both processes run on this machine: the relay is the link.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .. import records
from ..errors import PeerError, UsageError
from ..llm import checkpoints, llamacpp
from ..llm.shapes import cut_name, split_of
from ..llm.summary import per_token_energy, summarize
from ..llm.tokens import seeded_prompt
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions
from ..network.relay import LinkRelay, RelayCounts
from ..records import RunRecord
from ..transport.runconfig import RunConfig
from .processes import Placement, free_port

log = logging.getLogger("paretopipe.llamacpp")
#: Positions each slot has beyond its prompt and tokens (llama-server rounds its context up).
CONTEXT_SPARE = 64


@dataclasses.dataclass
class _Marks:
    """The relay's counts at each token's arrival, in arrival order."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    seen: list[tuple[float, RelayCounts]] = dataclasses.field(default_factory=list)


class LlamaCppPeer:
    """The two llama.cpp processes of a sweep and the relay between them (a :class:`StageGroup`)."""

    backend = "tcp"

    def __init__(self, placement: Placement, model: str, seed: int = 0) -> None:
        self.p, self.model, self.seed = placement, model, seed
        self.bins = llamacpp.binaries()
        self.gguf = llamacpp.gguf_of(model, placement.model_dir)
        self.facts = llamacpp.gguf_facts(self.gguf)
        self.dir = Path(tempfile.mkdtemp(prefix="paretopipe-llamacpp-"))
        self.rpc: subprocess.Popen | None = None
        self.server: subprocess.Popen | None = None
        self.server_key: tuple[int, int, int] | None = None  # (ngl, slots, context) of the running llama-server
        self.http_port = 0
        self.relay: LinkRelay | None = None

    # -- the processes ------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        port = free_port()
        self.rpc = self._spawn("ggml-rpc-server", llamacpp.rpc_server_argv(self.bins, "127.0.0.1", port,
                                                                         self.p.threads_for(1, 2)), stage=1)
        self._wait(lambda: _accepts(port), self.rpc, "ggml-rpc-server")
        self.relay = LinkRelay(("127.0.0.1", port))
        self.relay.start()
        splits = self.facts.layers + 2  # the suite's largest split of this model (its head stays last)
        name = checkpoints.display_name(self.model, self.p.model_dir)
        return {"model": name, "fingerprint": checkpoints.file_digest(Path(self.gguf)), "num_blocks": splits,
                "block_cuts": [cut_name(k) for k in range(splits + 1)], "devices": ["cpu", "cpu"]}

    def _spawn(self, name: str, argv: list[str], stage: int) -> subprocess.Popen:
        """A llama.cpp process on the cores our engine's stage of the same index gets (taskset: its
        threads start after the pinning), its output in the group's folder."""
        cpus = self.p.local_cpus(stage, 2)
        if cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        with open(self.dir / f"{name}.log", "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def _wait(self, ready: Callable[[], bool], proc: subprocess.Popen, name: str) -> None:
        deadline = time.monotonic() + self.p.wait_time
        while not ready():
            if proc.poll() is not None:
                lines = (self.dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
                errors = [line for line in lines if " E " in line]  # llama.cpp's log level: its reason first
                raise PeerError(f"{name} exited ({proc.returncode}): {' | '.join(errors[:2] or lines[-3:])[:300]}")
            if time.monotonic() > deadline:
                raise PeerError(f"{name} was not ready in {self.p.wait_time:g} s (its log: {self.dir / name}.log)")
            time.sleep(0.05)

    def _serve(self, ngl: int, slots: int, context: int) -> None:
        """``llama-server`` holding all but ``ngl`` layers, loaded over an unshaped link."""
        if self.server_key == (ngl, slots, context) and self.server is not None and self.server.poll() is None:
            return
        self._stop_server()
        assert self.relay is not None and self.relay.port is not None
        self.relay.shape(None, None)
        self.http_port = free_port()
        argv = llamacpp.server_argv(self.bins, self.gguf, f"127.0.0.1:{self.relay.port}", ngl, self.http_port,
                                    self.p.threads_for(0, 2), slots, context)
        self.server = self._spawn("llama-server", argv, stage=0)
        self._wait(lambda: llamacpp.healthy(self.http_port), self.server, "llama-server")
        self.server_key = (ngl, slots, context)

    def _stop_server(self) -> None:
        if self.server is not None:
            _end(self.server)
        self.server, self.server_key = None, None

    def alive(self) -> bool:
        return self.rpc is not None and self.rpc.poll() is None

    def stop(self) -> None:
        self._stop_server()
        if self.rpc is not None:
            _end(self.rpc)
            self.rpc = None
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- one run ------------------------------------------------------------------------------
    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, observed: dict | None,
            budget: float, cpu_traces: dict[str, str] | None = None, link_down: Any = None) -> RunRecord:
        g = cfg.generation
        if g is None or len(cfg.cuts) != 1 or g.prompt is not None:
            raise UsageError(f"--engine {llamacpp.ENGINE} runs a language model's two-stage split on seeded prompts "
                             f"(--prompt-len)")
        split = split_of(cfg.cuts[0])
        ngl = llamacpp.offloaded_layers(split, self.facts.layers)
        prompts = [seeded_prompt(g.prompt_len, self.facts.vocab, cfg.seed, s)
                   for s in range(g.streams + g.warmup_streams)]
        self._serve(ngl, g.streams, g.streams * (max(map(len, prompts)) + g.gen_tokens + CONTEXT_SPARE))
        assert self.relay is not None
        self.relay.shape(*((conditions.up, conditions.down) if conditions is not None else (None, None)),
                         seed=cfg.seed)
        sampler = llamacpp.sampling(g.temperature, g.top_k, cfg.seed)
        for prompt in prompts[g.streams:]:  # warm-up streams: one at a time, not measured
            llamacpp.generate(self.http_port, prompt, g.gen_tokens, sampler, budget)
        before = self.relay.counts()
        streamed, marks = self._measure(prompts[:g.streams], g.gen_tokens, sampler, budget)
        batches = _steps(streamed, marks, before)
        record = records.build_run_record(
            backend=self.backend, run_id=records.new_run_id(self.model, cfg.cuts[0]), status=records.COMPLETE,
            error=None, config=cfg.to_dict(), manifest=self._manifest(cfg, ngl, conditions, before),
            batches=batches, sysmon={})
        record["generation"] = {"prompt_tokens": [len(p) for p in prompts[:g.streams]],
                                "tokens": [s.tokens for s in streamed], "stages": self._stages(ngl),
                                "exactness": None, "server_timings": [s.timings for s in streamed]}
        record["summary"].update(summarize(batches, record["generation"], record["manifest"]["link"]))
        per_token_energy(record["summary"])
        record["summary"].update(_server_figures(streamed))
        return RunRecord.of(record, "llama.cpp's run")

    def _measure(self, prompts: list[list[int]], tokens: int, sampler: dict[str, Any],
                 budget: float) -> tuple[list[llamacpp.Streamed], _Marks]:
        """Every measured stream at once (one slot each), each token's arrival marked with the
        relay's counts."""
        marks = _Marks()
        relay = self.relay
        assert relay is not None

        def mark(now: float) -> None:
            with marks.lock:
                marks.seen.append((now, relay.counts()))

        out: list[Any] = [None] * len(prompts)

        def one(i: int) -> None:
            try:
                out[i] = llamacpp.generate(self.http_port, prompts[i], tokens, sampler, budget, on_token=mark)
            except PeerError as exc:
                out[i] = exc
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(budget)
        failed = next((o for o in out if not isinstance(o, llamacpp.Streamed)), None)
        if failed is not None or any(t.is_alive() for t in threads):
            raise PeerError(f"llama.cpp's run: {failed or 'a stream did not finish in time'}")
        return out, marks

    def _stages(self, ngl: int) -> list[dict[str, Any]]:
        here = self.facts.layers - ngl
        return [{"program": "llama-server", "layers": [0, here], "kv_bytes": None},
                {"program": "ggml-rpc-server", "layers": [here, self.facts.layers], "kv_bytes": None}]

    def _manifest(self, cfg: RunConfig, ngl: int, conditions: NetworkConditions | None,
                  before: RelayCounts) -> dict[str, Any]:
        engine = {"engine": llamacpp.ENGINE, "version": self.bins.build.get("llama_cpp_python"),
                  "build": self.bins.build, "gguf": self.facts.manifest(), "ngl": ngl}
        stages = [node_manifest("cpu", self.p.threads_for(j, 2), role=f"stage{j + 1}", program=program,
                                engine={**engine, "threads": self.p.threads_for(j, 2)},
                                limits={"cpus": self.p.local_cpus(j, 2)})
                  for j, program in enumerate(("llama-server", "ggml-rpc-server"))]
        link = {"mode": cfg.link_mode, "conditions": conditions.to_dict() if conditions is not None else None,
                "note": "llama.cpp's RPC connections carried by paretopipe's relay (network/relay.py), each "
                        "direction through the emulated link; bytes and round trips counted there"}
        return {"stages": stages, "link": link, "relay_before_run": before.to_dict(),
                "inputs": {"prompts": "seeded token ids (llm.tokens.seeded_prompt), the same as our engine's"}}


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)


def _steps(streamed: list[llamacpp.Streamed], marks: _Marks, before: RelayCounts) -> list[dict[str, Any]]:
    """The batch records of a run's steps, one per token of each stream, with the relay's counts
    (up bytes, down bytes, round trips) since the mark before. Tokens of several streams that
    arrive at one mark: the first stream's carries its counts."""
    zero = min(s.sent_s for s in streamed)
    delta, last = {}, (before.up_bytes, before.down_bytes, before.round_trips)
    for when, c in sorted(marks.seen, key=lambda m: m[0]):
        now = (c.up_bytes, c.down_bytes, c.round_trips)
        delta[when], last = tuple(a - b for a, b in zip(now, last)), now
    later = [(delta.get(t, (0, 0, 0)), n, t - p) for s in streamed for (p, _), (t, n) in zip(s.events, s.events[1:])]
    tokens = sum(n for _, n, _ in later) or 1
    mean = tuple(sum(d[i] for d, _, _ in later) / tokens for i in range(3))
    gap = statistics.median([g / n for _, n, g in later for _ in range(n)]) if later else 0.0
    steps: list[dict[str, Any]] = []
    for stream, s in enumerate(streamed):
        shared = _shared(s, delta, gap, mean)
        for step, ((start, end, counts), token) in enumerate(zip(shared, s.tokens)):
            steps.append({"seq": len(steps), "warmup": False, "stream": stream, "step": step, "start_s": start - zero,
                          "end_s": end - zero, "latency_s": end - start, "token": token, "payload_bytes": counts[0],
                          "wire_bytes": counts[0], "result_wire_bytes": counts[1], "round_trips": counts[2]})
    return steps


def _shared(s: llamacpp.Streamed, delta: dict[float, tuple], gap: float,
            mean: tuple) -> list[tuple[float, float, tuple]]:
    """Each token's (start, end, counts) of one stream. An event that brought n tokens (held back by
    ``llama-server``) shares its interval and counts evenly among them; the stream's first event
    gives its held tokens the run's median time and mean counts per token, and its prefill the rest."""
    out, start = [], s.sent_s
    for j, (arrival, n) in enumerate(s.events):
        counts = delta.pop(arrival, (0, 0, 0))
        for i in range(n):
            if j == 0:
                end = max(start, arrival - (n - 1 - i) * gap)
                share = tuple(max(0.0, c - (n - 1) * m) for c, m in zip(counts, mean)) if i == 0 else mean
            else:
                end, share = start + (arrival - start) / (n - i), tuple(c / n for c in counts)
            out.append((start, end, share))
            start = end
    return out


def _server_figures(streamed: list[llamacpp.Streamed]) -> dict[str, float | None]:
    """``llama-server``'s own clock: its median prompt time (TTFT without HTTP) and time per token."""
    def median(key: str) -> float | None:
        xs = sorted(float(s.timings[key]) / 1e3 for s in streamed if isinstance(s.timings.get(key), (int, float)))
        return xs[len(xs) // 2] if xs else None
    return {"server_ttft_median_s": median("prompt_ms"), "server_tpot_median_s": median("predicted_per_token_ms")}
