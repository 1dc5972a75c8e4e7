"""Helpers to run both TCP stages: in one process (threads) or as real processes."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import PYTHON, ROOT
from paretopipe.partition.stages import StageBuilder
from paretopipe.transport import messaging, tcp
from paretopipe.transport.runconfig import DEFAULT_MAX_PAYLOAD, RunConfig
from paretopipe.workload import GENERATION

TCP = messaging.TransportSpec("tcp")


def _specs(transports, count: int) -> list:
    """One transport spec per stage (the same one for all when one is given: tcp by default)."""
    if transports is None:
        return [TCP] * count
    if isinstance(transports, messaging.TransportSpec):
        return [transports] * count
    return list(transports)


_BUILD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _builder(name: str) -> StageBuilder:
    return StageBuilder(name)


def builder(name: str) -> StageBuilder:
    """One StageBuilder per model for the whole test session. Tracing is not thread-safe (torch.fx
    patches modules while it traces), so threads that ask at once take turns."""
    with _BUILD_LOCK:
        return _builder(name)


def run_in_threads(name: str, split_index: int, tmp: Path, conditions=None, secret=None, encrypt="none",
                   transports=None, **cfg_kw):
    """Both stages in this process over 127.0.0.1; returns (stage-1 outcome, stage-2 outcome).
    ``transports``: one TransportSpec for both stages, or one per stage (MQTT: each its own user)."""
    spec1, spec2 = _specs(transports, 2)
    b = builder(name)
    cuts = b.cuts_for(split_index)
    cfg = RunConfig(model=b.name, cuts=cuts, split_index=split_index, timeout_s=60,
                    link_mode="emulated" if conditions else "none",
                    network=conditions.name if conditions else None, **cfg_kw)
    listener = tcp.StageListener(messaging.listen(spec1, "127.0.0.1", 0, DEFAULT_MAX_PAYLOAD), tcp.identity_of(b),
                                 secret, encrypt=encrypt)
    out: dict = {}

    def stage1():
        try:
            out["s1"] = tcp.run_stage1(listener, b, cfg, conditions=conditions, connect_timeout=30,
                                       keep_outputs=True, output_dir=tmp / "s1")
        except BaseException as exc:  # surfaced by the caller
            out["s1_error"] = exc

    th = threading.Thread(target=stage1)
    th.start()
    try:  # stage 1 ends and the listener closes even where stage 2 fails (a stage 1 that failed first)
        sock = messaging.connect(spec2, "127.0.0.1", listener.port, 10, DEFAULT_MAX_PAYLOAD)
        connection = tcp.open_connection(sock, b, cuts=cuts, secret=secret, encrypt=encrypt)
        (s2,) = tcp.serve_connection(connection, b, output_dir=tmp, timeout_s=60)
    finally:
        th.join(60)
        listener.close()
    if "s1_error" in out:
        raise out["s1_error"]
    return out["s1"], s2


def reference_outputs(name: str, batch: int, count: int) -> list:
    """The unsplit model's outputs on the synthetic batches a run of ``count`` batches sends."""
    import torch

    from paretopipe.partition import models
    from paretopipe.transport import inputs

    b = builder(name)
    with torch.no_grad():
        return [b.model(x) for x in inputs.batches("synthetic", batch, models.input_size(name), count, seed=0)]


def serve_one_run(listener, spec, tmp: Path, name: str = "mobilenetv2", split_index: int = 6):
    """A real stage 2 over ``spec`` connects to ``listener`` (a stage 1's, which may have refused
    strangers first) and one short run completes: (stage-1 outcome, stage-2 outcome)."""
    b = builder(name)
    cfg = RunConfig(model=b.name, cuts=b.cuts_for(split_index), split_index=split_index, batch_size=1, num_batches=2,
                    warmup=0, timeout_s=30)
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault("s1", tcp.run_stage1(
        listener, b, cfg, connect_timeout=20, keep_outputs=True, output_dir=tmp)))
    th.start()
    sock = messaging.connect(spec, "127.0.0.1", listener.port, 10, 1 << 20)
    (s2,) = tcp.serve_connection(tcp.open_connection(sock, b, cuts=cfg.cuts), b, output_dir=tmp, timeout_s=30)
    th.join(60)
    return out["s1"], s2


def run_chain_in_threads(name: str, plan: list[int | str], tmp: Path, conditions=None, secret=None, encrypt="none",
                         next_stage: bool = True, transports=None, **cfg_kw):
    """A chain of len(plan) + 1 stages in this process over 127.0.0.1: stage 1 listens, each middle
    stage connects to the one before and listens for the next. Returns the outcomes in stage order
    (each later stage's list of runs); ``next_stage=False`` starts the middle stage without one."""
    b = builder(name)
    # A plan of block indices, or of fine cut names (a name with "+" is a live set of several tensors).
    cuts = [k if isinstance(k, str) else b.partitioner.block_cut(k) for k in plan]
    blocks = all(isinstance(k, int) for k in plan)
    cfg = RunConfig(model=b.name, cuts=cuts, split_index=list(plan) if blocks else None, timeout_s=60,
                    link_mode="emulated" if conditions else "none",
                    network=conditions.name if conditions else None, **cfg_kw)
    specs = _specs(transports, len(plan) + 1)
    listener = tcp.StageListener(messaging.listen(specs[0], "127.0.0.1", 0, DEFAULT_MAX_PAYLOAD),
                                 tcp.identity_of(b), secret, encrypt=encrypt)
    out: dict = {}
    threads = []

    def guarded(key, fn):
        def body():
            try:
                out[key] = fn()
            except BaseException as exc:  # surfaced by the caller
                out[f"{key}_error"] = exc
        th = threading.Thread(target=body, name=key)
        th.start()
        threads.append(th)

    guarded("stage1", lambda: tcp.run_stage1(listener, b, cfg, conditions=conditions, connect_timeout=30,
                                             keep_outputs=True, output_dir=tmp / "stage1"))
    port = listener.port
    listeners = []
    for j in range(2, len(plan) + 2):
        middle = j < len(plan) + 1 and (next_stage or j > 2)
        downstream = None
        if middle:
            nxt = tcp.StageListener(messaging.listen(specs[j - 1], "127.0.0.1", 0, DEFAULT_MAX_PAYLOAD),
                                    tcp.identity_of(b), secret, encrypt=encrypt)
            listeners.append(nxt)
            downstream = tcp.Downstream(nxt, 30)

        def serve(port=port, downstream=downstream, j=j):
            sock = messaging.connect(specs[j - 1], "127.0.0.1", port, 10, DEFAULT_MAX_PAYLOAD)
            connection = tcp.open_connection(sock, b, cuts=cuts, secret=secret, encrypt=encrypt)
            return tcp.serve_connection(connection, b, output_dir=tmp / f"stage{j}", timeout_s=60,
                                        downstream=downstream)
        guarded(f"stage{j}", serve)
        if not middle:
            break
        port = downstream.listener.port
    for th in threads:
        th.join(120)
    for lst in [listener, *listeners]:
        lst.close()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTED: list = []
# The CLIs the tests run are forked from one zygote per test process, which imports torch, torchvision
# and the command-line code once (4.5 s of CPU a process otherwise). A forked CLI is a real process
# with its own pipes, session and exit code; a start-up variable it needs (faketime's LD_PRELOAD, a
# PYTHONPATH) or a prefix command makes it a plain Popen. Tests about a fresh interpreter (--help
# imports no torch) start theirs with subprocess directly.
# With them, what a sweep's report draws with (1 s of CPU a sweep or report), and what a language
# model's command line builds its stage with (Workload.preload: 1.4 s of CPU each).
CLI_PRELOAD = ("torch", "torchvision", "paretopipe.cli.stages", "paretopipe.cli.rpc", "paretopipe.cli.main",
               "paretopipe.partition.stages", "paretopipe.transport.tcp", "paretopipe.transport.rpc",
               "paretopipe.controller.rpc_ranks", "paretopipe.profile", "paretopipe.analysis.report",
               "matplotlib.pyplot", "adjustText", *GENERATION.preload)
_zygote = None
#: The start-up variables (``zygote.STARTUP_PREFIXES``) every test begins with, once collection has
#: imported the test modules (tests/conftest.py sets them, and puts them back after each test). The
#: zygote starts with these, whichever test starts it: one started inside a test that had changed
#: one (a library imported for the first time) refused every fork after that test: 86 command lines
#: started as fresh interpreters in one pass.
STARTUP_ENV: dict[str, str] | None = None


def _forked(argv: list[str], env: dict[str, str], cwd) -> object | None:
    """``argv`` forked from the test process's zygote, or None where a fork would differ."""
    global _zygote
    from paretopipe.controller import zygote

    if not zygote.enabled():
        return None
    if _zygote is None:
        base = dict(os.environ)
        if STARTUP_ENV is not None:
            base = {k: v for k, v in base.items() if k not in zygote.startup_env(base)} | STARTUP_ENV
        _zygote = zygote.Zygote(preload=CLI_PRELOAD, env=base)
    return _zygote.fork(argv, env, cwd=str(cwd) if cwd else None)


def workers(proc) -> list:
    """The live stage workers (``python -m paretopipe.controller.worker``) of a sweep that ``popen``
    started: its descendants when it started plainly; when it was forked, its stages come from its
    own zygote, which this test process's CLI zygote forked (one test at a time uses it)."""
    import psutil

    roots = [proc.pid]
    if _zygote is not None and _zygote._proc is not None and not isinstance(proc, subprocess.Popen):
        roots.append(_zygote._proc.pid)
    found = {}
    for pid in roots:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                if "paretopipe.controller.worker" in " ".join(child.cmdline()):
                    found[child.pid] = child
        except psutil.Error:  # it ended meanwhile
            continue
    return list(found.values())


def popen(argv: list[str], cwd=ROOT, env=None):
    """A CLI with piped text stdio in its own session (forked where it can be, else Popen);
    conftest kills every such group after each test."""
    env = dict(env) if env is not None else dict(os.environ)
    proc = _forked(argv, env, cwd) or subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                        stderr=subprocess.PIPE, text=True, env=env,
                                                        start_new_session=True)
    STARTED.append(proc)
    return proc


def run(argv: list[str], cwd=ROOT, env=None, timeout: float | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)`` through ``popen``: the child is
    killed if it outlives ``timeout``, and the call raises TimeoutExpired as run does."""
    proc = popen(argv, cwd=cwd, env=env)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def start(script: str, *args: str, prefix: list[str] | None = None, env=None):
    """Start a script in its own process group; conftest kills every group after each test."""
    argv = prefix + [PYTHON, str(ROOT / script)] if prefix else [PYTHON, script]
    return popen([*argv, *args], env={**os.environ, **(env or {})})  # a prefix is never forked


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    """Block until ``needle`` appears on the process's stderr (readiness, not a sleep)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise AssertionError(f"process exited early: {''.join(seen)}")
            continue
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not seen in {timeout}s: {''.join(seen)}")


def kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stage2_freezes_dies_and_returns(s1, s2, stage2_args: list[str], out_dir: Path, ready: str,
                                    pause_s: float, settle_s: float):
    """Once stage 1 logs ``ready``: freeze stage 2 past the deadline (SIGSTOP), resume it, kill it,
    let stage 1 serve alone for ``settle_s``, and start a new one with ``stage2_args`` (writing into
    ``out_dir``); returns the new one. Stage 1 is held (SIGSTOP) from the moment the new stage 2
    starts until it has connected, so the return is seen however fast stage 1 serves alone: a run
    needs only the batches of these pauses, not enough to outlast a stage 2's start."""
    wait_for_line(s1, ready, 120)
    time.sleep(pause_s)
    kill_group(s2, signal.SIGSTOP)   # frozen: its results come after the deadline
    time.sleep(pause_s)
    kill_group(s2, signal.SIGCONT)
    time.sleep(pause_s)
    kill_group(s2)                   # dead
    time.sleep(settle_s)
    kill_group(s1, signal.SIGSTOP)
    try:
        back = start("partition2.py", *stage2_args, "--out", str(out_dir))  # ...and back
        wait_connected(back, 120)
    finally:
        kill_group(s1, signal.SIGCONT)
    return back


def wait_connected(proc: subprocess.Popen, timeout: float) -> None:
    """Block until ``proc`` holds an established TCP connection (the kernel completes it into the
    listener's backlog even while the listening process is stopped)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited before it connected: {proc.stderr.read()[-2000:]}")
        try:
            if any(c.status == psutil.CONN_ESTABLISHED for c in psutil.Process(proc.pid).net_connections("tcp")):
                return
        except psutil.Error:
            pass  # it ended (or is ending) since the poll: the next one says so, with its stderr
        time.sleep(0.05)
    raise AssertionError(f"no connection in {timeout}s")


def assert_logits_equal_unsplit(npz: Path, model_name: str, count: int, batch_size: int = 1,
                                atol: float = 1e-5) -> None:
    """The logits a run saved equal the unsplit model's on the same synthetic inputs (atol 1e-5;
    an engine's export, ONNX Runtime's, agrees to its own tolerance)."""
    import numpy as np
    import torch

    from paretopipe.transport import inputs

    logits = np.load(npz, allow_pickle=False)["logits"]
    model = builder(model_name).model
    with torch.no_grad():
        ref = torch.stack([model(x) for x in inputs.batches("synthetic", batch_size, 224, count, seed=0)]).numpy()
    assert logits.shape == ref.shape
    assert np.allclose(logits, ref, atol=atol)


def block_profiles(name: str, stage1_block_s: float, stage2_block_s: float) -> list:
    """Two device profiles of ``name`` at block granularity, with the real bytes that cross each
    block cut and a chosen time per block on each stage (a slow edge device and a fast server:
    numbers chosen, not measured, so that a choice depends on the link alone)."""
    from paretopipe.predict.adaptive_policy import self_profile

    part = builder(name).partitioner
    bpi = [part.payload_nbytes(part.block_cut(k), 1) for k in range(part.num_blocks + 1)]
    n = len(bpi) - 1
    return [self_profile(builder(name).name, 1, {"segment_compute_s": [s] * n, "whole_model_s": s * n,
                                                 "call_overhead_s": 0.0}, bpi, role)
            for role, s in (("stage1", stage1_block_s), ("stage2", stage2_block_s))]
