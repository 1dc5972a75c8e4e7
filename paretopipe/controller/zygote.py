"""A fork server for the stage processes a sweep starts on this machine.

Importing torch and torchvision costs about 4.5 s of CPU on a 2-core x86 VM and several times that
on a Pi, and a local sweep starts two to five stage processes per model, again after every failure.
The zygote is one interpreter that imports the stage code (and with it torch and torchvision) once
and forks each worker or rank from that state; the fork costs milliseconds and shares the imported
pages. A forked stage is a real process with its own stdio pipes, session, environment, working
directory and process title (``ps`` shows ``python -m paretopipe.controller.worker --role stage2 ...``),
and its exit status comes back as ``Popen.returncode`` would. As with a Popen, its pid stays its own
until this side has read that status: the zygote holds the ended child as a zombie until then, so a
signal sent by pid (a fault, a stop by process group) never reaches a process that took the pid over.

Why not ``multiprocessing``'s forkserver: its children re-import the parent's ``__main__`` and get
``/dev/null`` as stdin, while a stage process needs the sweep's pipes and its own argv.

The zygote forks before any thread of its own exists (it serves one request at a time, in one
thread). A zygote forks only for the values of the variables read at interpreter or library start
(``PYTHON*``, ``OMP_*``, ``LD_*``, ...) that it started with. A sweep keeps one zygote per set of
those values (a few at most): a library that sets one in ``os.environ`` as it loads (OpenCV's
import sets ``LD_LIBRARY_PATH``, scikit-learn's ``KMP_*``) would otherwise send every later stage
to a fresh interpreter. Everything is started with ``subprocess.Popen`` when no zygote can start
(``PARETOPIPE_NO_ZYGOTE=1`` turns them off).
Requests carry JSON and three file descriptors over a socketpair between the sweep and its own
zygote; nothing on it comes from a network. This module is the sweep's side; the zygote process
is :mod:`paretopipe.controller.zygote_server`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

# What a stage imports on its way to its first run (the stage modules import these lazily, so that
# their --help stays fast).
PRELOAD = ("torch", "torchvision", "paretopipe.partition.stages", "paretopipe.transport.tcp",
           "paretopipe.transport.rpc", "paretopipe.controller.adaptive_setup", "paretopipe.controller.worker",
           "paretopipe.controller.rpc_ranks")
# Read once, when an interpreter, a native library or a module a zygote imports starts: a child
# that needs other values than the zygote's cannot get them by a fork. Hugging Face's (HF_*,
# TRANSFORMERS_*, and XDG_CACHE_HOME under HF_HOME) are read as transformers is imported, which a
# language model's zygote does (Workload.preload); matplotlib's (MPLBACKEND, MPLCONFIGDIR) as it is.
# TMPDIR: tempfile keeps the folder it first found, and the preload (torch) has asked for it.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "LD_", "MALLOC_", "NUMEXPR_",
                    "HF_", "TRANSFORMERS_", "XDG_CACHE_HOME", "MPL", "TMPDIR")
MAX_REQUEST = 1 << 20  # a request's JSON, bytes


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that an interpreter or a native library reads once, at start."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


# -- the sweep's side -----------------------------------------------------------------------------
class ForkedProcess:
    """What the sweep holds for a forked stage: the part of ``subprocess.Popen`` it uses."""

    def __init__(self, args: list[str], pid: int, stdin: Any, stdout: Any, stderr: Any) -> None:
        self.args, self.pid = args, pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        """Popen.communicate's contract: write ``input``, close stdin, read both outputs to their
        end, and wait; TimeoutExpired if the child outlives ``timeout``."""
        out: dict[str, str] = {}

        def drain(name: str, stream: Any) -> None:
            out[name] = stream.read() if stream is not None else ""

        readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
                   for n, s in (("out", self.stdout), ("err", self.stderr))]
        for reader in readers:
            reader.start()
        if self.stdin is not None and not self.stdin.closed:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        return out["out"], out["err"]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One fork server, started on first use and ended when this process closes it or exits."""

    def __init__(self, preload: Sequence[str] = PRELOAD, start_timeout: float = 120.0,
                 env: dict[str, str] | None = None, daemon: str | None = None) -> None:
        self.preload, self.start_timeout = list(preload), start_timeout
        self.imports: list[str] = []  # a workload's modules, imported once it is ready (preload_more)
        self.daemon = daemon  # the name of a host's zygote daemon to use (zygote_daemon), not one of our own
        self.env = dict(os.environ if env is None else env)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._replies: list[dict[str, Any]] = []
        self._reply = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}
        self._exits: dict[int, int] = {}
        self.failed: str | None = None

    def _start(self) -> None:
        self._sock = self._forked_server() or (self._daemon_server() if self.daemon else self._new_server())
        threading.Thread(target=self._listen, daemon=True, name="zygote-replies").start()
        try:
            if "ready" not in self._next_reply(self.start_timeout):
                raise OSError("the zygote did not start")
            if self.imports:
                self._ask_to_import(self.imports)
        except OSError:
            if self._proc is not None:
                self._proc.kill()
            raise

    def _forked_server(self) -> socket.socket | None:
        """In a process a zygote forked: the socket of a zygote forked for it from that one."""
        inherited = _take_inherited(self.env)
        if inherited is None:
            return None
        try:
            inherited.send(json.dumps({"zygote": self.preload}).encode())
        except OSError:
            inherited.close()
            return None
        return inherited

    def _new_server(self) -> socket.socket:
        """The socket of a new zygote interpreter."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "paretopipe.controller.zygote_server", "--fd", str(theirs.fileno()),
                 "--preload", ",".join(self.preload)], pass_fds=[theirs.fileno()], env=self.env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        return mine

    def _daemon_server(self) -> socket.socket:
        """A connection to this user's zygote daemon of our name, started here (detached) if none
        listens: it binds before it imports, so the connection waits for its imports, not a poll."""
        deadline, started = time.monotonic() + self.start_timeout, False
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect("\0" + self.daemon)  # abstract: one name space per network namespace
                if not same_user(sock):
                    raise OSError(f"the zygote daemon {self.daemon!r} runs as another user")
                return sock
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()
            except OSError:
                sock.close()
                raise
            if not started:
                subprocess.Popen([sys.executable, "-m", "paretopipe.controller.zygote_server", "--listen", self.daemon,
                                  "--preload", ",".join(self.preload)], env=self.env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                started = True
            if time.monotonic() > deadline:
                raise OSError(f"the zygote daemon {self.daemon!r} did not start")
            time.sleep(0.02)

    def _listen(self) -> None:
        sock = self._sock
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if "exit" in msg:
                with self._reply:
                    child = self._children.pop(msg["exit"], None)
                    if child is None:
                        self._exits[msg["exit"]] = msg["code"]
                if child is not None:
                    child._exited(msg["code"])
                # Only now may the zygote free the pid: until this process knew the child had ended,
                # a signal it sent by pid had to reach that child (a zombie) and nothing else.
                try:
                    sock.send(json.dumps({"reap": msg["exit"]}).encode())
                except OSError:
                    pass
                continue
            with self._reply:
                self._replies.append(msg)
                self._reply.notify_all()
        # The zygote is gone: its children were reparented, and their codes can no longer be known.
        with self._reply:
            self.failed = self.failed or "the zygote exited"
            orphans, self._children = list(self._children.values()), {}
            self._reply.notify_all()
        for child in orphans:
            child._exited(-signal.SIGKILL)

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        with self._reply:
            if not self._reply.wait_for(lambda: self._replies or self.failed, timeout):
                raise OSError("the zygote did not answer")
            if not self._replies:
                raise OSError(self.failed)
            return self._replies.pop(0)

    def usable_for(self, env: dict[str, str]) -> bool:
        return self.failed is None and startup_env(env) == startup_env(self.env)

    def fork(self, argv: Sequence[str], env: dict[str, str], cwd: str | None = None) -> ForkedProcess | None:
        """``argv`` (``python -m module ...`` or ``python script.py ...``) forked with this environment,
        or None where a fork would not be the same start as a fresh interpreter's."""
        if len(argv) < 2 or argv[0] != sys.executable or not self.usable_for(env):
            return None
        try:
            if argv[1] == "-m" and len(argv) >= 3:
                return self.spawn(argv[2], argv[3:], env, cwd=cwd)
            if argv[1].endswith(".py"):
                return self.spawn(None, argv[2:], env, cwd=cwd, script=os.path.join(cwd or os.getcwd(), argv[1]))
        except OSError:
            pass  # a plain start is slower, not different
        return None

    def preload_more(self, modules: Sequence[str]) -> None:
        """Have the zygote import ``modules`` too, before it forks the next stage: once it has
        started, or at once where it runs already. Unlike ``preload``, one that fails to import
        leaves the zygote serving: the stage that imports it reports it as its own error."""
        with self._lock:
            new = [m for m in modules if m not in self.preload + self.imports]
            self.imports += new
            if new and self._sock is not None:
                try:
                    self._ask_to_import(new)
                except OSError:
                    pass  # a zygote that is gone fails the next fork, which starts the stage plainly

    def _ask_to_import(self, modules: Sequence[str]) -> None:
        """The zygote's import request (``{"import": [names]}``, served between forks); OSError
        where the zygote is gone."""
        self._sock.send(json.dumps({"import": list(modules)}).encode())

    def warm(self) -> None:
        """Start the zygote unless it runs already (or could not)."""
        with self._lock:
            if self._sock is None and self.failed is None:
                try:
                    self._start()
                except OSError as exc:
                    self.failed = str(exc)

    def spawn(self, module: str | None, args: Sequence[str], env: dict[str, str], cwd: str | None = None,
              script: str | None = None, stdio: tuple[int, int, int] | None = None) -> ForkedProcess:
        """Fork ``python -m module args`` (or ``python script args``) with this environment, in ``cwd``
        (default: ours), on new pipes or on the descriptors ``stdio`` (then the ForkedProcess has no
        streams); OSError when the zygote cannot."""
        with self._lock:
            if self.failed:
                raise OSError(self.failed)
            try:
                if self._sock is None:
                    self._start()
                pipes = [os.pipe() for _ in range(3)] if stdio is None else []
                theirs = list(stdio) if stdio is not None else [pipes[0][0], pipes[1][1], pipes[2][1]]
                req = {"module": module, "script": script, "args": [str(a) for a in args], "env": env,
                       "cwd": str(cwd or os.getcwd())}
                try:
                    socket.send_fds(self._sock, [json.dumps(req).encode()], theirs)
                    reply = self._next_reply(30.0)
                finally:
                    for fd in theirs if stdio is None else ():
                        os.close(fd)
                if "pid" not in reply:
                    for fd in (pipes[0][1], pipes[1][0], pipes[2][0]) if pipes else ():
                        os.close(fd)
                    raise OSError(f"the zygote refused: {reply.get('error')}")
            except OSError as exc:
                self.failed = self.failed or str(exc)
                raise
            pid = reply["pid"]
            streams = (open(pipes[0][1], "w", buffering=1), open(pipes[1][0], "r"),
                       open(pipes[2][0], "r", errors="backslashreplace")) if pipes else (None, None, None)
            child = ForkedProcess([sys.executable, *(["-m", module] if module else [script]), *args], pid, *streams)
            with self._reply:
                if pid in self._exits:  # it ended before we got here
                    child._exited(self._exits.pop(pid))
                else:
                    self._children[pid] = child
            return child

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self._sock.close()
                self._sock = None
            if self._proc is not None:
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
            self.failed = self.failed or "the zygote was shut down"


# This process's zygotes, one per set of start-up values (startup_env), each started on first use.
_shared: dict[tuple[tuple[str, str], ...], Zygote] = {}
_shared_lock = threading.Lock()
#: Beyond this many start-up environments in one process, a stage starts plainly: each zygote holds
#: an interpreter with torch imported.
MAX_ZYGOTES = 3
# In a process that a zygote forked: the channel on which that zygote forks it a zygote of its own
# (from its untouched, imported state: no second interpreter), and the start-up environment they share.
_inherited: tuple[socket.socket, dict[str, str]] | None = None
_inherited_lock = threading.Lock()


def inherit(channel: socket.socket) -> None:
    """In a process the zygote just forked: the channel on which that zygote forks it a zygote of
    its own, and the start-up environment they share (read by :meth:`Zygote._forked_server`)."""
    global _inherited
    with _inherited_lock:
        _inherited = (channel, startup_env(dict(os.environ)))


def _take_inherited(env: dict[str, str]) -> socket.socket | None:
    """The inherited channel, once, for a zygote whose start-up environment is the forking zygote's."""
    global _inherited
    with _inherited_lock:
        if _inherited is None or startup_env(env) != _inherited[1]:
            return None
        channel, _inherited = _inherited[0], None
        return channel


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of a unix socket runs as our user (its SO_PEERCRED):
    an abstract socket has no file permissions, so this is what keeps other users off a zygote."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


def set_title(title: str) -> None:
    """A forked process's command line as ``ps`` shows it: that of the process it stands for."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # only the title in ps differs
        pass


def enabled() -> bool:
    """False where ``PARETOPIPE_NO_ZYGOTE=1`` asks for plain starts only."""
    return os.environ.get("PARETOPIPE_NO_ZYGOTE") != "1"


def _shared_zygote(env: dict[str, str] | None = None) -> Zygote | None:
    """This process's zygote for the start-up values of ``env`` (default: this process's
    environment), started with ``env`` on first use; an earlier zygote keeps serving its children,
    and stages started with its values. None past MAX_ZYGOTES, or when zygotes are off."""
    if not enabled():
        return None
    full = dict(os.environ if env is None else env)
    key = tuple(sorted(startup_env(full).items()))
    with _shared_lock:
        zygote = _shared.get(key)
        if zygote is None and len(_shared) < MAX_ZYGOTES:
            zygote = _shared[key] = Zygote(PRELOAD, env=full)
            atexit.register(zygote.close)
        return zygote


def prestart(preload: Sequence[str] = ()) -> None:
    """Start this process's zygote now, in the background, so that its imports overlap the sweep's
    own set-up instead of delaying the first stage; ``preload``: the modules its workload's stages
    import beyond ``PRELOAD`` (``Workload.preload``)."""
    zygote = _shared_zygote()
    if zygote is not None:
        zygote.preload_more(preload)
        threading.Thread(target=zygote.warm, daemon=True, name="zygote-start").start()


def launch(argv: list[str], env: dict[str, str] | None, fork: bool = True) -> subprocess.Popen | ForkedProcess:
    """Start a stage process: forked from this process's zygote when ``fork`` allows, ``argv`` is
    ``python -m module ...`` (or a script) and the environment allows it, else ``subprocess.Popen``
    (an SSH command line is never forked). Both speak text lines on stdin, stdout and stderr, in a
    session of their own."""
    full_env = {**os.environ, **(env or {})}
    zygote = _shared_zygote(full_env) if fork else None
    forked = zygote.fork(argv, full_env) if zygote is not None else None
    return forked or subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, bufsize=1, start_new_session=True, env=full_env if env else None)
