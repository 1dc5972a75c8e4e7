"""The two processes of llama.cpp's peer (``--engine llamacpp``), each a worker the sweep drives
by JSON lines, here or on a host over SSH (``python -m paretopipe.runners.llamacpp_worker``):

- ``--side server`` (stage 2) runs ``ggml-rpc-server`` and reports its port;
- ``--side client`` (stage 1) holds a :class:`~paretopipe.network.relay.LinkRelay` in front of the
  server and runs ``llama-server --rpc`` through it, and runs each configuration: a generation of
  the run's streams, its prompts the same token ids our engine gets, timed on this process's clock
  as each token streams in. The record has our engine's columns, each step carrying the bytes each
  way and the round trips the relay counted since the step before.

``llama-server`` starts again for each split (``-ngl`` is fixed at load), with the relay unshaped
while it loads (its offloaded weights cross once, not per token). With the emulated link the relay
applies each run's conditions; with ``--link tc`` on hosts the link itself is shaped and the relay
only counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import records
from ..compute import cpushare
from ..argtypes import host_port
from ..errors import ParetoPipeError, PeerError, UsageError
from ..llm import checkpoints, llamacpp
from ..llm.shapes import cut_name, split_of
from ..llm.summary import per_token_energy, summarize
from ..llm.prompts import seeded_prompt
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions
from ..network.relay import LinkRelay, RelayCounts
from ..transport.runconfig import RunConfig
from ..options import flags
from .commands import RunCommand, emit, serve_commands
from .processes import free_port

log = logging.getLogger("paretopipe.llamacpp")
MODULE = "paretopipe.runners.llamacpp_worker"
#: Positions each slot has beyond its prompt and tokens (llama-server rounds its context up).
CONTEXT_SPARE = 64


@dataclasses.dataclass(kw_only=True)
class PeerOptions(flags.CommandLine):
    """A llama.cpp worker's command line (the one declaration the sweep writes and the worker parses)."""

    side: str                            # server (ggml-rpc-server, stage 2) or client (stage 1)
    model: str = flags.option(flags.MODEL, required=True)
    model_dir: str | None = flags.option(flags.MODEL_DIR)
    threads: int | None = flags.option(flags.THREADS)
    cpus: str | None = flags.option(flags.CPUS)
    cpu_share: float | None = flags.option(flags.CPU_SHARE)  # the program's share of a core (a slower device)
    host: str = "127.0.0.1"              # the server's address to listen on
    port: int = 0                        # the server's port (0: a free one)
    rpc: str | None = None               # the client's server, HOST:PORT
    wait_time: float = 120.0


@dataclasses.dataclass
class _Marks:
    """The relay's counts at each token's arrival, in arrival order."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    seen: list[tuple[float, RelayCounts]] = dataclasses.field(default_factory=list)


class _Programs:
    """The llama.cpp programs this worker started, pinned, held to its CPU share and logged in its
    own folder."""

    def __init__(self, opts: PeerOptions) -> None:
        self.opts = opts
        self.bins = llamacpp.binaries()
        self.dir = Path(tempfile.mkdtemp(prefix="paretopipe-llamacpp-"))
        self.shares: dict[int, dict[str, Any]] = {}  # pid -> the cgroup its program runs in

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """A program on this worker's cores (taskset: its threads start after the pinning), in a
        group of its CPU share (all its threads: llama.cpp's network and compute threads are one
        pool, unlike our stages', whose compute threads alone join theirs)."""
        if self.opts.cpus and shutil.which("taskset"):
            argv = ["taskset", "-c", self.opts.cpus, *argv]
        with open(self.dir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        if self.opts.cpu_share is not None:
            try:
                self.shares[proc.pid] = cpushare.limit(proc.pid, self.opts.cpu_share, f"llamacpp-{name}")
            except ParetoPipeError:
                _end(proc)
                raise
        return proc

    def limits(self) -> dict[str, Any]:
        """What the manifest says of this worker's cores and share."""
        share = next(iter(self.shares.values()), None)
        return {"cpus": self.opts.cpus, **({k: share[k] for k in ("cpu_share", "cgroup", "scope")} if share else {})}

    def end(self, proc: subprocess.Popen) -> None:
        _end(proc)
        applied = self.shares.pop(proc.pid, None)
        if applied is not None:
            cpushare.release(applied, proc.pid)

    def wait(self, ready: Callable[[], bool], proc: subprocess.Popen, name: str) -> None:
        deadline = time.monotonic() + self.opts.wait_time
        while not ready():
            if proc.poll() is not None:
                lines = (self.dir / f"{name}.log").read_text(errors="replace").strip().splitlines()
                errors = [line for line in lines if " E " in line]  # llama.cpp's log level: its reason first
                raise PeerError(f"{name} exited ({proc.returncode}): {' | '.join(errors[:2] or lines[-3:])[:300]}")
            if time.monotonic() > deadline:
                raise PeerError(f"{name} was not ready in {self.opts.wait_time:g} s (its log: {self.dir / name}.log)")
            time.sleep(0.05)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class ServerSide:
    """Stage 2: ``ggml-rpc-server``, listening where the sweep said."""

    def __init__(self, opts: PeerOptions) -> None:
        self.opts, self.programs = opts, _Programs(opts)
        self.proc: subprocess.Popen | None = None

    def start(self) -> dict[str, Any]:
        port = self.opts.port or free_port()
        argv = llamacpp.rpc_server_argv(self.programs.bins, self.opts.host, port, self.opts.threads or 1)
        self.proc = self.programs.spawn("ggml-rpc-server", argv)
        self.programs.wait(lambda: _accepts("127.0.0.1", port), self.proc, "ggml-rpc-server")
        return {"port": port, "manifest": node_manifest("cpu", self.opts.threads, limits=self.programs.limits())}

    def handle(self, cmd: Any) -> None:
        raise UsageError("ggml-rpc-server's worker takes no command but quit")

    def close(self) -> None:
        if self.proc is not None:
            self.programs.end(self.proc)
            self.proc = None
        self.programs.close()


class ClientSide:
    """Stage 1: the relay in front of the server, ``llama-server`` through it, and the runs."""

    def __init__(self, opts: PeerOptions) -> None:
        self.opts, self.programs = opts, _Programs(opts)
        self.gguf = llamacpp.gguf_of(opts.model, opts.model_dir)
        self.facts = llamacpp.gguf_facts(self.gguf)
        self.server: subprocess.Popen | None = None
        self.server_key: tuple[int, int, int] | None = None  # (ngl, slots, context) of the running llama-server
        self.http_port = 0
        self.relay: LinkRelay | None = None

    def start(self) -> dict[str, Any]:
        """The relay in front of the server; the model as a stage group reports it (:class:`GroupInfo`)."""
        self.relay = LinkRelay(host_port(self.opts.rpc or "", f"--rpc {self.opts.rpc!r}", "127.0.0.1:50052"))
        self.relay.start()
        splits = self.facts.layers + 2  # the suite's largest split of this model (its head stays last)
        return {"model": checkpoints.display_name(self.opts.model, self.opts.model_dir),
                "fingerprint": checkpoints.file_digest(Path(self.gguf)), "num_blocks": splits,
                "block_cuts": [cut_name(k) for k in range(splits + 1)], "devices": ["cpu", "cpu"]}

    def _serve(self, ngl: int, slots: int, context: int) -> None:
        """``llama-server`` holding all but ``ngl`` layers, loaded over an unshaped link."""
        if self.server_key == (ngl, slots, context) and self.server is not None and self.server.poll() is None:
            return
        self._stop_server()
        assert self.relay is not None and self.relay.port is not None
        self.relay.shape(None, None)
        self.http_port = free_port()
        argv = llamacpp.server_argv(self.programs.bins, self.gguf, f"127.0.0.1:{self.relay.port}", ngl,
                                    self.http_port, self.opts.threads or 1, slots, context)
        self.server = self.programs.spawn("llama-server", argv)
        self.programs.wait(lambda: llamacpp.healthy(self.http_port), self.server, "llama-server")
        self.server_key = (ngl, slots, context)

    def _stop_server(self) -> None:
        if self.server is not None:
            self.programs.end(self.server)
        self.server, self.server_key = None, None

    def close(self) -> None:
        self._stop_server()
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        self.programs.close()

    def handle(self, cmd: RunCommand) -> None:
        cfg = RunConfig.from_dict(cmd.config)
        conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
        record = self.run(cfg, conditions, cfg.timeout_s * (cfg.num_batches + cfg.warmup + 2) + self.opts.wait_time)
        emit({"event": "done", "status": record["status"], "record": record})

    # -- one run ------------------------------------------------------------------------------
    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, budget: float) -> dict[str, Any]:
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
        record = records.build_run_record(
            backend="tcp", run_id=records.new_run_id(cfg.model, cfg.cuts[0]), status=records.COMPLETE,
            error=None, config=cfg.to_dict(), manifest=self._manifest(cfg, ngl, conditions, before),
            batches=_steps(streamed, marks, before), sysmon={})
        record["generation"] = {"prompt_tokens": [len(p) for p in prompts[:g.streams]],
                                "tokens": [s.tokens for s in streamed], "stages": self._stages(ngl),
                                "exactness": None, "server_timings": [s.timings for s in streamed]}
        record["summary"].update(summarize(record["batches"], record["generation"], record["manifest"]["link"]))
        per_token_energy(record["summary"])
        record["summary"].update(_server_figures(streamed))
        return record

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
        """Stage 1's node and both stages' engine; the sweep adds stage 2's node (its worker's)."""
        engine = {"engine": llamacpp.ENGINE, "version": self.programs.bins.build.get("llama_cpp_python"),
                  "build": self.programs.bins.build, "gguf": self.facts.manifest(), "ngl": ngl}
        stages = [node_manifest("cpu", self.opts.threads, role="stage1", program="llama-server",
                                engine={**engine, "threads": self.opts.threads}, limits=self.programs.limits()),
                  {"role": "stage2", "program": "ggml-rpc-server", "engine": engine}]
        shaped = "each direction through the emulated link" if conditions is not None else \
            "the link shaped by tc" if cfg.link_mode == "tc" else "unshaped"
        link = {"mode": cfg.link_mode, "conditions": conditions.to_dict() if conditions is not None else None,
                "note": f"llama.cpp's RPC connections carried by paretopipe's relay (network/relay.py), {shaped}; "
                        f"bytes and round trips counted there"}
        return {"stages": stages, "link": link, "relay_before_run": before.to_dict(),
                "inputs": {"prompts": "seeded token ids (llm.prompts.seeded_prompt), the same as our engine's"}}


def _accepts(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
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
        xs = [float(s.timings[key]) / 1e3 for s in streamed if isinstance(s.timings.get(key), (int, float))]
        return statistics.median(xs) if xs else None
    return {"server_ttft_median_s": median("prompt_ms"), "server_tpot_median_s": median("predicted_per_token_ms")}


def main(argv: Sequence[str] | None = None) -> int:
    opts = PeerOptions.parse(argv, f"python -m {MODULE}", "A llama.cpp worker of the sweep (JSON lines on stdin/"
                             "stdout): --side server runs ggml-rpc-server, --side client llama-server and the runs.")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops llama.cpp's programs
    side: ServerSide | ClientSide | None = None
    try:
        side = ServerSide(opts) if opts.side == "server" else ClientSide(opts)
        emit({"event": "ready", "pid": os.getpid(), **side.start()})
        if serve_commands({"run": RunCommand} if isinstance(side, ClientSide) else {}, side.handle,
                          f"llama.cpp's {opts.side}"):
            emit({"event": "bye"})
    except ParetoPipeError as exc:
        emit({"event": "error", "error": str(exc)})
        return exc.exit_code
    finally:
        if side is not None:
            side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
