"""The two processes of llama.cpp's peer (``--engine llamacpp``), each a worker the sweep drives
by JSON lines, here or on a host over SSH (``python -m paretopipe.controller.llamacpp_worker``):

- ``--side server`` (stage 2, or each later stage of a plan) runs ``ggml-rpc-server`` and reports
  its port;
- ``--side client`` (stage 1) holds a :class:`~paretopipe.network.relay.LinkRelay` in front of
  each server and runs ``llama-server --rpc`` through them, and runs each configuration: a
  generation of the run's streams, its prompts the same token ids our engine gets, timed on this
  process's clock as each token streams in. The record has our engine's columns, each step carrying
  the bytes each way and the round trips the relays counted since the step before (llama.cpp's
  client talks to each server itself: a plan of three stages is a star around stage 1, not a chain).

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
from ..llm.llamacpp_steps import TokenMarks, server_figures, token_steps
from ..llm.shapes import cut_name, split_of
from ..llm.summary import per_token_energy, summarize
from ..llm.prompts import seeded_prompt
from ..manifest import node_manifest
from ..network.conditions import NetworkConditions
from ..network.relay import LinkRelay, RelayCounts, sum_counts
from ..transport.runconfig import RunConfig
from ..options import flags
from .commands import RunCommand, emit, serve_commands
from .processes import free_port

log = logging.getLogger("paretopipe.llamacpp")
MODULE = "paretopipe.controller.llamacpp_worker"
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
    rpc: str | None = None               # the client's servers in stage order, HOST:PORT[,HOST:PORT...]
    wait_time: float = 120.0


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
    """Stage 1: a relay in front of each server, ``llama-server`` through them, and the runs."""

    def __init__(self, opts: PeerOptions) -> None:
        self.opts, self.programs = opts, _Programs(opts)
        self.gguf = llamacpp.gguf_of(opts.model, opts.model_dir)
        self.facts = llamacpp.gguf_facts(self.gguf)
        self.server: subprocess.Popen | None = None
        self.server_key: tuple[llamacpp.Offload, int, int] | None = None  # the running llama-server's
        self.http_port = 0
        self.relays: list[LinkRelay] = []
        self.loaded: dict[str, Any] | None = None  # where llama-server says it put the layers

    def start(self) -> dict[str, Any]:
        """A relay in front of each server; the model as a stage group reports it (:class:`GroupInfo`)."""
        servers = [host_port(address, f"--rpc {self.opts.rpc!r}", "127.0.0.1:50052")
                   for address in (self.opts.rpc or "").split(",")]
        for server in servers:
            self.relays.append(LinkRelay(server))
            self.relays[-1].start()
        splits = self.facts.layers + 2  # the suite's largest split of this model (its head stays last)
        return {"model": checkpoints.display_name(self.opts.model, self.opts.model_dir),
                "fingerprint": checkpoints.file_digest(Path(self.gguf)), "num_blocks": splits,
                "block_cuts": [cut_name(k) for k in range(splits + 1)], "devices": ["cpu"] * (len(self.relays) + 1)}

    def counts(self) -> list[RelayCounts]:
        """What crossed each server's relay, in stage order."""
        return [relay.counts() for relay in self.relays]

    def _rpc(self) -> list[str]:
        """The relays' addresses as ``llama-server --rpc`` takes them, and its log names the devices."""
        return [f"127.0.0.1:{relay.port}" for relay in self.relays]

    def _serve(self, placed: llamacpp.Offload, slots: int, context: int) -> None:
        """``llama-server`` holding the first layers and the servers the rest, loaded over unshaped
        links; where it says it put each layer must be the plan's."""
        if self.server_key == (placed, slots, context) and self.server is not None and self.server.poll() is None:
            return
        self._stop_server()
        for relay in self.relays:
            relay.shape(None, None)
        self.http_port = free_port()
        argv = llamacpp.server_argv(self.programs.bins, self.gguf, self._rpc(), placed, self.http_port,
                                    self.opts.threads or 1, slots, context)
        self.server = self.programs.spawn("llama-server", argv)
        self.programs.wait(lambda: llamacpp.healthy(self.http_port), self.server, "llama-server")
        self.server_key = (placed, slots, context)
        self.loaded = llamacpp.loaded_layers((self.programs.dir / "llama-server.log").read_text(errors="replace"))
        self._check_loaded(placed)

    def _check_loaded(self, placed: llamacpp.Offload) -> None:
        """The layers llama-server's log gives each device are the plan's (None: a log that does not say)."""
        if self.loaded is None:
            return
        want = {"CPU": placed.stage_layers[0][1] - placed.stage_layers[0][0],
                **{rpc: end - first for rpc, (first, end) in zip(self._rpc(), placed.stage_layers[1:])}}
        want = {device: n for device, n in want.items() if n}  # a device of no layers has no KV cache to log
        got = {device: n for device, n in self.loaded["layers"].items() if n}
        if got != want or not self.loaded["output_offloaded"]:
            raise PeerError(f"llama-server placed layers {got} (head offloaded: {self.loaded['output_offloaded']}), "
                            f"not the plan's {want}")

    def _stop_server(self) -> None:
        if self.server is not None:
            self.programs.end(self.server)
        self.server, self.server_key = None, None

    def close(self) -> None:
        self._stop_server()
        for relay in self.relays:
            relay.close()
        self.relays = []
        self.programs.close()

    def handle(self, cmd: RunCommand) -> None:
        cfg = RunConfig.from_dict(cmd.config)
        conditions = NetworkConditions.from_dict(cmd.conditions) if cmd.conditions else None
        record = self.run(cfg, conditions, cfg.timeout_s * (cfg.num_batches + cfg.warmup + 2) + self.opts.wait_time)
        emit({"event": "done", "status": record["status"], "record": record})

    # -- one run ------------------------------------------------------------------------------
    def run(self, cfg: RunConfig, conditions: NetworkConditions | None, budget: float) -> dict[str, Any]:
        g = cfg.generation
        if cfg.workload.refusal("llamacpp") or len(cfg.cuts) != len(self.relays) or g.prompt is not None:
            raise UsageError(f"--engine {llamacpp.ENGINE} runs a language model's split over its {len(self.relays)} "
                             f"server(s) ({len(self.relays)} cut(s), not {len(cfg.cuts)}) on seeded prompts (--prompt-len)")
        placed = llamacpp.offload([split_of(cut) for cut in cfg.cuts], self.facts.layers)
        prompts = [seeded_prompt(g.prompt_len, self.facts.vocab, cfg.seed, s)
                   for s in range(g.streams + g.warmup_streams)]
        self._serve(placed, g.streams, g.streams * (max(map(len, prompts)) + g.gen_tokens + CONTEXT_SPARE))
        for hop, relay in enumerate(self.relays):  # each server's link, as each hop of our chain has one
            relay.shape(*((conditions.up, conditions.down) if conditions is not None else (None, None)),
                        seed=cfg.seed + hop)
        sampler = llamacpp.sampling(g.temperature, g.top_k, cfg.seed)
        for prompt in prompts[g.streams:]:  # warm-up streams: one at a time, not measured
            llamacpp.generate(self.http_port, prompt, g.gen_tokens, sampler, budget)
        before = self.counts()
        streamed, marks = self._measure(prompts[:g.streams], g.gen_tokens, sampler, budget)
        record = records.build_run_record(
            backend="tcp", run_id=records.new_run_id(cfg.model, "-".join(cfg.cuts)), status=records.COMPLETE,
            error=None, config=cfg.to_dict(), manifest=self._manifest(cfg, placed, conditions, before),
            batches=token_steps(streamed, marks, before), sysmon={})
        record["generation"] = {"prompt_tokens": [len(p) for p in prompts[:g.streams]],
                                "tokens": [s.tokens for s in streamed], "stages": self._stages(placed),
                                "exactness": None, "server_timings": [s.timings for s in streamed]}
        record["summary"].update(summarize(record["batches"], record["generation"], record["manifest"]["link"]))
        per_token_energy(record["summary"])
        record["summary"].update(server_figures(streamed))
        return record

    def _measure(self, prompts: list[list[int]], tokens: int, sampler: dict[str, Any],
                 budget: float) -> tuple[list[llamacpp.Streamed], TokenMarks]:
        """Every measured stream at once (one slot each), each token's arrival marked with the
        relay's counts."""
        marks = TokenMarks()

        def mark(now: float) -> None:
            with marks.lock:
                marks.seen.append((now, self.counts()))

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

    def _stages(self, placed: llamacpp.Offload) -> list[dict[str, Any]]:
        """Each stage's program and layers (``[first, end)``; the last also holds the head), as
        llama-server's log confirmed them (:meth:`_check_loaded`)."""
        programs = ["llama-server"] + ["ggml-rpc-server"] * len(self.relays)
        return [{"program": program, "layers": list(layers), "kv_bytes": None}
                for program, layers in zip(programs, placed.stage_layers)]

    def _manifest(self, cfg: RunConfig, placed: llamacpp.Offload, conditions: NetworkConditions | None,
                  before: list[RelayCounts]) -> dict[str, Any]:
        """Stage 1's node and every stage's engine; the sweep adds each server's node (its worker's)."""
        engine = {"engine": llamacpp.ENGINE, "version": self.programs.bins.build.get("llama_cpp_python"),
                  "build": self.programs.bins.build, "gguf": self.facts.manifest(), "ngl": placed.ngl,
                  "tensor_split": list(placed.tensor_split), "loaded": self.loaded}
        stages = [node_manifest("cpu", self.opts.threads, role="stage1", program="llama-server",
                                engine={**engine, "threads": self.opts.threads}, limits=self.programs.limits())]
        stages += [{"role": f"stage{j + 2}", "program": "ggml-rpc-server", "engine": engine,
                    "rpc": "%s:%d" % relay.target} for j, relay in enumerate(self.relays)]
        shaped = "each direction through the emulated link" if conditions is not None else \
            "the link shaped by tc" if cfg.link_mode == "tc" else "unshaped"
        link = {"mode": cfg.link_mode, "conditions": conditions.to_dict() if conditions is not None else None,
                "note": f"llama.cpp's RPC connections carried by paretopipe's relay (network/relay.py), {shaped}; "
                        f"bytes and round trips counted there"}
        return {"stages": stages, "link": link, "relay_before_run": sum_counts(before).to_dict(),
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
