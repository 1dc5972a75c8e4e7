"""The zygote process (:mod:`paretopipe.controller.zygote` starts it and speaks to it): it imports the
stage code once, then forks one child per request, each becoming the stage process the request
describes with the request's pipes, session, environment, working directory and title, and sends
back each child's pid and, once reaped, its exit status. A child may ask, on a channel of its own,
for a zygote of its own: one is forked from this imported state.

    python -m paretopipe.controller.zygote_server --fd N [--preload torch,...]
    python -m paretopipe.controller.zygote_server --listen NAME [--preload torch,...]

With ``--listen`` it is a host's daemon (:mod:`paretopipe.controller.zygote_daemon` starts and uses
it): it listens on an abstract unix socket, serves each connection of its own user from a fork of
itself, as a sweep's own zygote would, and exits once it has served nothing for IDLE_S.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import io
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any, Sequence

from paretopipe.controller import zygote
from paretopipe.controller.zygote import MAX_REQUEST, PRELOAD


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(obj).encode())
    except OSError:
        pass  # the sweep is gone; the loop ends at its EOF


def _child(req: dict[str, Any], fds: list[int], sock: socket.socket, channel: socket.socket,
           others: Sequence[socket.socket]) -> None:
    """In the forked child: become the stage process the request describes, run it, exit. The child
    keeps ``channel``, on which it can ask for a zygote of its own (see ``Zygote._start``)."""
    code: Any = 1
    try:
        for theirs in (sock, *others):
            theirs.close()
        zygote.inherit(channel)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        module, script, args = req.get("module"), req.get("script"), [str(a) for a in req["args"]]
        zygote.set_title(" ".join([sys.executable, *(["-m", module] if module else [script]), *args]))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False),
                                                       errors="backslashreplace", line_buffering=True)
        sys.argv = [module or script, *args]
        import runpy
        import warnings

        # The stage's module was imported before the fork (that is the point), and runpy says so.
        warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python script.py does
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        atexit._run_exitfuncs()  # what a normal interpreter exit runs
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code or 0)


def _reap(sock: socket.socket, children: set[int], ended: set[int], helpers: set[int]) -> None:
    """Report each child that ended, but leave it a zombie: its pid stays reserved, as a Popen's does
    until its owner waits, so that a signal the sweep sends by pid (a fault, a stop by process group)
    before it has read the exit cannot reach a process that took the pid over. The sweep answers
    with ``{"reap": pid}`` (:func:`_release`). A child's own zygote is reaped at once: nobody signals it."""
    for pid in list(helpers):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            helpers.discard(pid)
    for pid in list(children):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            children.discard(pid)
        if info is None:
            continue
        children.discard(pid)
        ended.add(pid)
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        _send(sock, {"exit": pid, "code": code})


def _release(pid: Any, ended: set[int]) -> None:
    """The sweep has read ``pid``'s exit: the pid may now go to another process."""
    if pid in ended:
        ended.discard(pid)
        os.waitpid(pid, 0)


def serve(sock: socket.socket, preload: Sequence[str]) -> int:
    """The zygote's loop: import, say ready, then fork one child per request until the sweep closes
    its end; children are reaped and their exit codes sent back."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the sweep's to handle
    for name in preload:
        importlib.import_module(name)
    try:
        import setproctitle

        # Its set-up finds argv through environ, so it runs once here, before a child replaces environ.
        setproctitle.setproctitle(setproctitle.getproctitle())
    except ImportError:
        pass
    _send(sock, {"ready": os.getpid()})
    channels: list[socket.socket] = []  # one per live child: where it may ask for a zygote of its own
    children: set[int] = set()  # forked for the sweep, not yet ended
    ended: set[int] = set()  # ended and reported, held as zombies until the sweep has read the exit
    helpers: set[int] = set()
    while True:
        readable, _, _ = select.select([sock, *channels], [], [], 0.05)
        _reap(sock, children, ended, helpers)
        for channel in readable:
            if channel is not sock:
                channels.remove(channel)
                _serve_a_zygote(channel, sock, channels, helpers)
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
        except OSError:
            return 0
        if not data:
            return 0  # the sweep is gone: its children see EOF on stdin and end themselves
        try:
            req = _request(data, fds)
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": str(exc)})
            continue
        if "reap" in req:
            _release(req["reap"], ended)
            continue
        if "import" in req:
            _import_quietly(req["import"])
            continue
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = _fork()
        if pid == 0:
            _child(req, fds, sock, theirs, [mine, *channels])
        theirs.close()
        channels.append(mine)
        children.add(pid)
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})


def _fork() -> int:
    """``os.fork()``, with every object this state holds frozen out of the cyclic collector's view
    first (``gc.freeze``, as Python's docs advise before a fork without exec). Otherwise a child's
    first full collection walks the zygote's half-million imported objects (torch, torchvision,
    transformers): 0.3 s of CPU in a stage that built its model in 0.2 s, and, as it writes to each
    object's header, a copy of every page the child shared with its zygote."""
    gc.freeze()
    return os.fork()


def _import_quietly(modules: Sequence[str]) -> None:
    """Import a workload's stage modules in this state, which the next forks share; one that fails
    is left to the stage that imports it, which reports it as its own error."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the stage's own import says what is wrong
            pass


def _request(data: bytes, fds: list[int]) -> dict[str, Any]:
    """A fork request (JSON naming a module or a script, with three descriptors), the sweep's word
    that it has read an exit (``{"reap": pid}``) or a workload's modules to import first
    (``{"import": [names]}``), the last two without descriptors; ValueError otherwise."""
    req = json.loads(data)
    if isinstance(req, dict) and set(req) == {"reap"} and isinstance(req["reap"], int) and not fds:
        return req
    if (isinstance(req, dict) and set(req) == {"import"} and isinstance(req["import"], list) and not fds
            and all(isinstance(m, str) for m in req["import"])):
        return req
    if len(fds) != 3 or not isinstance(req, dict):
        raise ValueError("a request carries JSON and three descriptors")
    if isinstance(req.get("module"), str) == isinstance(req.get("script"), str):
        raise ValueError("a request names a module or a script")
    return req


def _serve_a_zygote(channel: socket.socket, sock: socket.socket, channels: list[socket.socket],
                    helpers: set[int]) -> None:
    """A child asked on its channel for a zygote of its own (or ended, closing it): fork one from
    this untouched state, which serves the child on that channel, as a fresh zygote would."""
    try:
        req = json.loads(channel.recv(MAX_REQUEST) or b"null")
    except (OSError, ValueError):
        req = None
    if not isinstance(req, dict) or not isinstance(req.get("zygote"), list):
        channel.close()
        return
    helpers.add(_fork_serving(channel, [sock, *channels], [str(m) for m in req["zygote"]]))
    channel.close()


def _fork_serving(channel: socket.socket, others: Sequence[socket.socket], preload: Sequence[str]) -> int:
    """Fork a copy of this imported state that closes ``others`` and serves ``channel`` as a zygote
    of its own (:func:`serve`) until its peer is gone; the fork's pid."""
    pid = _fork()
    if pid == 0:
        code = 1
        try:
            for theirs in others:
                theirs.close()
            code = serve(channel, preload)
        finally:
            os._exit(code)
    return pid


#: In a daemon's command line, as it is started and as it titles itself (NULs read as spaces):
#: what ``lab down`` looks for (``lab_processes.stop_zygote_daemons``).
DAEMON_MARK = "paretopipe.controller.zygote_server --listen"
#: A daemon with no connection for this long exits: a sweep starts a model's stages seconds after
#: the last model's ended, and an idle interpreter holding torch is memory a Pi needs.
IDLE_S = 30.0


def listen(name: str, preload: Sequence[str], idle_s: float = IDLE_S) -> int:
    """A host's zygote daemon: bind the abstract socket ``name`` (or leave, when another daemon holds
    it), import, then serve each connection from our user in a fork running :func:`serve`."""
    import importlib

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        srv.bind("\0" + name)
    except OSError:
        return 0  # another daemon started first: it serves
    srv.listen(64)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Without the preload list, which names the stage modules: whatever looks for a stage by its
    # command line (a fault, a test) must not take the daemon for one.
    zygote.set_title(f"{sys.executable} -m {DAEMON_MARK} {name}")
    for module in preload:
        importlib.import_module(module)
    handlers: set[int] = set()  # one per connection: a fork of this imported state serving it
    last = time.monotonic()
    while True:
        ready, _, _ = select.select([srv], [], [], 1.0)
        for pid in list(handlers):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                handlers.discard(pid)
        if handlers:
            last = time.monotonic()
        if not ready:
            if time.monotonic() - last > idle_s:
                return 0
            continue
        conn, _ = srv.accept()
        if not zygote.same_user(conn):
            conn.close()
            continue
        handlers.add(_fork_serving(conn, [srv], []))
        conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fork server for local stage processes (started by a sweep)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="this end of the sweep's socketpair")
    where.add_argument("--listen", metavar="NAME", help="serve as a host's daemon on this abstract unix socket")
    parser.add_argument("--preload", default=",".join(PRELOAD), help="modules to import before forking")
    parser.add_argument("--idle", type=float, default=IDLE_S, help="a daemon exits after this many seconds unused")
    args = parser.parse_args(argv)
    if args.listen:
        return listen(args.listen, [m for m in args.preload.split(",") if m], args.idle)
    sock = socket.socket(fileno=args.fd)
    return serve(sock, [m for m in args.preload.split(",") if m])


if __name__ == "__main__":
    sys.exit(main())
