"""llama.cpp as a peer engine (``--engine llamacpp``): where its binaries are, what a GGUF holds,
how the suite's split maps onto ``-ngl``, the command lines of its two processes, and one streamed
generation from ``llama-server``, timed on the client's clock. No torch here.

llama.cpp's RPC split: the client (``llama-server --rpc A[,B...]``) keeps the token embedding
and the first layers, and samples; ``-ngl N`` puts the last N-1 layers and the output "layer" (the
final norm and the LM head) on the servers, which is why the whole logits vector comes back each
token. So the suite's split k (the first k blocks on stage 1: the embedding and k-1 layers) is
``-ngl L+2-k``, for k in 1..L+1 (``llama-server``'s own log says how many layers it offloaded; the
worker checks it, :func:`loaded_layers`). Split 0 (the embedding elsewhere) and L+2 (the head
here) are not expressible: llama.cpp's client always holds the embedding, and ``-ngl 0`` leaves the
server nothing. Several servers (a plan of several cuts, ``--split-blocks``) share the offloaded
layers in ``--rpc`` order by ``--tensor-split``, each the layers up to the next cut, the last also
the head.
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import PeerError, UsageError
from . import checkpoints

ENGINE = "llamacpp"
#: The llama-cpp-python sdist whose llama.cpp is built, and the build's recipe (its flags' version):
#: the same as scripts/build_llamacpp.sh's PIN and RECIPE (tests/llm/test_llamacpp.py checks).
PIN, RECIPE = "0.3.36", 2
PROGRAMS = ("ggml-rpc-server", "llama-server")
#: A streamed event's size limit: one token's text and ids, or the last event's timings.
MAX_EVENT_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Binaries:
    """The built ``ggml-rpc-server`` and ``llama-server``, and how they were built (build.json)."""

    folder: Path
    build: dict[str, Any]

    @property
    def rpc_server(self) -> str:
        return str(self.folder / "ggml-rpc-server")

    @property
    def server(self) -> str:
        return str(self.folder / "llama-server")


def cache_root() -> Path:
    """Where ``scripts/build_llamacpp.sh`` puts its builds (``PARETOPIPE_LLAMACPP_DIR`` overrides)."""
    given = os.environ.get("PARETOPIPE_LLAMACPP_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paretopipe" / "llamacpp"


def binaries(root: Path | None = None) -> Binaries:
    """The newest cached build of ``scripts/build_llamacpp.sh`` of this pin and recipe for this
    machine; refused in one line that names the script when there is none (a sweep never compiles
    for 11 minutes). Read from the cache, not from the script: an installed paretopipe has no
    ``scripts/``, and a build of other flags (an older recipe) must not be taken for this one."""
    root = root or cache_root()
    found = []
    for build in root.glob(f"{PIN}-*/build.json"):
        try:
            meta = json.loads(build.read_text())
        except (OSError, ValueError):
            continue
        folder = build.parent / "bin"
        if isinstance(meta, dict) and meta.get("recipe") == RECIPE and meta.get("machine") == platform.machine() \
                and all(os.access(folder / name, os.X_OK) for name in PROGRAMS):
            found.append((build.stat().st_mtime, folder, meta))
    if not found:
        raise UsageError(f"--engine {ENGINE}: llama.cpp {PIN} is not built on this machine (nothing in {root}); "
                         f"build it once with bash scripts/build_llamacpp.sh (about 11 minutes on 2 cores)")
    _, folder, meta = max(found, key=lambda f: f[0])
    return Binaries(folder, meta)


@dataclasses.dataclass(frozen=True)
class GgufFacts:
    """What the manifest and the split need of a GGUF file, read from its header."""

    path: str
    architecture: str
    layers: int
    vocab: int
    quantisation: str

    def manifest(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gguf_facts(path: str) -> GgufFacts:
    """The GGUF's architecture, layer count and quantisation; a file that is not a readable GGUF
    is refused in one line."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:  # imported only where a llama.cpp sweep reads a header
        raise UsageError(f"--engine {ENGINE}: reading {path} needs the gguf package (pip install 'paretopipe[real]')")
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise _not_a_gguf(path, exc)
    return _read_facts(path, stat.st_size, stat.st_mtime_ns)


def _not_a_gguf(path: str, exc: Exception) -> UsageError:
    return UsageError(f"--engine {ENGINE}: {path} is not a GGUF llama.cpp reads ({str(exc)[:80]})")


# gguf's reader parses every field, the 49,152 tokens of SmolLM2's vocabulary among them: about 2 s
# of CPU here for four facts. A process that checks several sweeps (a notebook, the tests) reads the
# same file again, so the facts are kept per path, size and modification time: a file rewritten in
# place is read afresh.
@functools.lru_cache(maxsize=8)
def _read_facts(path: str, size: int, mtime_ns: int) -> GgufFacts:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        arch = str(reader.get_field("general.architecture").contents())
        layers = int(reader.get_field(f"{arch}.block_count").contents())
        vocab = len(reader.get_field("tokenizer.ggml.tokens").data)
        kind = reader.get_field("general.file_type")
        quant = gguf.LlamaFileType(kind.contents()).name if kind is not None else "unknown"
    except (OSError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise _not_a_gguf(path, exc)
    return GgufFacts(path, arch, layers, vocab, quant.removeprefix("MOSTLY_"))


def gguf_of(model: str, model_dir: str | None) -> str:
    """The GGUF llama.cpp loads: ``--model-dir FILE.gguf`` or a named real model's file."""
    if model_dir is not None and model_dir.endswith(".gguf"):
        return model_dir
    if model_dir is None and checkpoints.is_real(model):
        return str(checkpoints.real_file(model))
    raise UsageError(f"--engine {ENGINE} runs a GGUF: give --model-dir FILE.gguf or --model "
                     f"{', '.join(checkpoints.REAL)}")


def offloaded_layers(split: int, layers: int) -> int:
    """``-ngl`` for the suite's split ``split`` of a model of ``layers`` layers; a split llama.cpp
    cannot express is refused in one line that gives the valid ones."""
    if not 1 <= split <= layers + 1:
        raise UsageError(f"--engine {ENGINE}: split {split} is not one llama.cpp can make (its client keeps the "
                         f"embedding, and the head goes to the server with the last layers); valid: 1..{layers + 1}, "
                         f"e.g. --splits 1-{layers + 1}")
    return layers + 2 - split


@dataclasses.dataclass(frozen=True)
class Offload:
    """How ``llama-server`` spreads a plan's stages over its RPC servers: ``-ngl`` and, for several
    servers, ``--tensor-split`` (each server's share of the offloaded layers, the head counted as
    one, in ``--rpc`` order), and the layers each stage holds (``[first, end)``; the last server's
    end is ``layers``, and it also holds the head)."""

    ngl: int
    tensor_split: tuple[int, ...]
    stage_layers: tuple[tuple[int, int], ...]

    def argv(self) -> list[str]:
        return ["-ngl", str(self.ngl)] + (["--tensor-split", ",".join(map(str, self.tensor_split))]
                                          if len(self.tensor_split) > 1 else [])


def offload(splits: list[int], layers: int) -> Offload:
    """The :class:`Offload` of the suite's cuts ``splits`` (one per RPC server, increasing). A
    server of no layers is refused: llama.cpp would skip it and the plan would not be what ran."""
    ngl = offloaded_layers(splits[0], layers)
    for k in splits[1:]:
        offloaded_layers(k, layers)
    if any(b <= a for a, b in zip(splits, splits[1:])):
        raise UsageError(f"--engine {ENGINE}: plan {','.join(map(str, splits))} gives a server no layers; give "
                         f"increasing cuts, e.g. --split-blocks 10,20")
    bounds = [0, *(k - 1 for k in splits), layers]
    stages = tuple(zip(bounds, bounds[1:]))
    shares = tuple(end - first for first, end in stages[1:-1]) + (stages[-1][1] - stages[-1][0] + 1,)
    return Offload(ngl, shares, stages)


_KV_TOTAL = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *\d+ cells, +(\d+) layers")
_KV_DEVICE = re.compile(r"llama_kv_cache: +(\S+?)(?:\[([^\]]+)\])? KV buffer size = +([\d.]+) MiB")


def loaded_layers(log: str) -> dict[str, Any] | None:
    """The layers ``llama-server`` (at ``-lv 4``) says it put on each device, from its log: each
    layer has a KV cache of the same size, so a device's KV buffer over one layer's gives its
    layers (``CPU``, or an RPC server's ``HOST:PORT``), and whether it offloaded the output layer.
    None where the log does not say (another version's wording)."""
    total = _KV_TOTAL.search(log)
    devices = _KV_DEVICE.findall(log)
    if total is None or not devices or float(total.group(1)) <= 0:
        return None
    per_layer = float(total.group(1)) / int(total.group(2))
    return {"layers": {(address or name): round(float(mib) / per_layer) for name, address, mib in devices},
            "output_offloaded": "offloading output layer to GPU" in log}


def rpc_server_argv(bins: Binaries, host: str, port: int, threads: int) -> list[str]:
    return [bins.rpc_server, "-H", host, "-p", str(port), "-t", str(threads)]


def server_argv(bins: Binaries, gguf: str, rpc: list[str], placed: Offload, port: int, threads: int, slots: int,
                context: int) -> list[str]:
    """``llama-server`` as stage 1: ``-fit off`` so that ``-ngl`` is the split asked for, no web UI,
    no warm-up batch (the run warms up with its own streams), one slot per stream, and no prompt
    cache in RAM (``-cram 0``): with it, a new prompt first copies the slot's old KV cache back from
    the RPC server, two round trips and the cache's bytes per offloaded layer, which made a run's
    time to first token depend on whether the prompt before it was the same. ``-lv 4`` logs where
    each layer went (:func:`loaded_layers`); nothing more per token."""
    return [bins.server, "-m", gguf, "--rpc", ",".join(rpc), *placed.argv(), "-t", str(threads), "-tb", str(threads),
            "-c", str(context), "-np", str(slots), "--host", "127.0.0.1", "--port", str(port), "--no-webui",
            "-fit", "off", "--no-warmup", "-cram", "0", "-lv", "4"]


def healthy(port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``llama-server`` on ``port`` has loaded its model and takes requests."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@dataclasses.dataclass
class Streamed:
    """One stream's generation as the client saw it: its request's time and each event's arrival
    with the tokens it brought (several where ``llama-server`` held tokens back), on this process's
    monotonic clock; the token ids; and ``llama-server``'s own timings."""

    sent_s: float
    tokens: list[int | None] = dataclasses.field(default_factory=list)
    events: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(n for _, n in self.events)


def sampling(temperature: float, top_k: int, seed: int) -> dict[str, Any]:
    """The request's sampler: greedy (top-1) at temperature 0, as our engine's, else its own."""
    if temperature <= 0:
        return {"samplers": ["top_k"], "top_k": 1}
    return {"temperature": temperature, "top_k": top_k, "seed": seed}


def generate(port: int, prompt: list[int], tokens: int, sampler: dict[str, Any], timeout_s: float,
             on_token: Callable[[float], None] | None = None) -> Streamed:
    """One generation of ``tokens`` tokens from ``prompt`` (token ids, no template), streamed;
    ``on_token`` is called at each event's arrival. The end-of-text token does not stop it (a
    benchmark's length is fixed), and no earlier prompt's cache is reused.

    ``llama-server`` holds back a token whose text ends inside a UTF-8 character and sends it with
    the next, naming only the last one's id: its count (``tokens_predicted``) says how many came, and
    the ids of such a stream come from the same request again, unstreamed (deterministic: greedy,
    or seeded), after the measurement."""
    request = {"prompt": prompt, "n_predict": tokens, "cache_prompt": False, "return_tokens": True,
               "ignore_eos": True, **sampler}
    out = Streamed(time.monotonic())
    for event in _events(port, {**request, "stream": True}, timeout_s):
        now, came = time.monotonic(), int(event.get("tokens_predicted") or 0) - out.count
        ids = [int(t) for t in event.get("tokens") or []]
        if came > 0:
            out.tokens += [None] * (came - len(ids)) + ids[-came:]
            out.events.append((now, came))
            if on_token is not None:
                on_token(now)
        if event.get("stop"):
            out.timings = dict(event.get("timings") or {})
    if out.count != tokens:
        raise PeerError(f"llama-server generated {out.count} tokens, not the {tokens} asked for")
    if None in out.tokens:
        (whole,) = _events(port, {**request, "stream": False}, timeout_s)
        out.tokens = [int(t) for t in whole.get("tokens") or []]
    return out


def _events(port: int, request: dict[str, Any], timeout_s: float) -> Iterator[dict[str, Any]]:
    """The JSON events of one ``/completion`` request as they arrive: each ``data:`` line of a
    stream, or the one reply; a refusal or a broken connection is a :class:`PeerError`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/completion", body=json.dumps(request), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise PeerError(f"llama-server answered {reply.status}: {reply.read(300).decode(errors='replace')}")
        if not request["stream"]:
            yield json.loads(reply.read())
            return
        while (line := reply.readline(MAX_EVENT_BYTES)):
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                yield event
                if event.get("stop"):
                    return
    except (OSError, ValueError) as exc:
        raise PeerError(f"llama-server on port {port}: {exc}") from None
    finally:
        conn.close()
