"""A host's zygote daemon, as a stage started over SSH uses it: real processes, a real abstract unix
socket, real signals. Each test has a daemon of its own (its PYTHONPATH, a start-up variable, is
part of the daemon's name), ended after it."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from paretopipe.controller import zygote, zygote_daemon

CHILD = '''
import json, os, sys
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "x": os.environ.get("ZYGOTE_TEST_X"), "main": __name__ == "__main__"}), flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    print(line.strip().upper(), flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
'''


@pytest.fixture
def env(tmp_path):
    (tmp_path / "daemon_child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PARETOPIPE_NO_ZYGOTE", None)
    yield env
    for proc in _daemons(zygote_daemon.daemon_name(env)):
        proc.kill()


def _daemons(name: str) -> list[psutil.Process]:
    """The daemons listening as ``name``: not the forks that serve their connections, which carry
    the daemon's title until they exit (one still ending made this list two)."""
    titled = [p for p in psutil.process_iter(["cmdline", "ppid"])
              if f"--listen {name}" in " ".join(p.info["cmdline"] or [])]
    pids = {p.pid for p in titled}
    return [p for p in titled if p.info["ppid"] not in pids]


def _attach(env, *args: str, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", zygote_daemon.ATTACH, "daemon_child", *args], env=env, cwd=cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _first_line(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


def test_stages_started_one_after_another_are_forks_of_one_daemon_on_their_own_stdio_env_cwd_and_exit_code(
        env, tmp_path):
    first = _attach({**env, "ZYGOTE_TEST_X": "one"}, "3", cwd=tmp_path)
    hello = _first_line(first)
    out, err = first.communicate("ping\nexit\n", timeout=120)
    assert first.returncode == 3 and out == "PING\n", err
    assert hello["pid"] != first.pid and hello["cwd"] == str(tmp_path) and hello["x"] == "one"
    assert hello["argv"] == ["3"] and hello["main"]
    daemon = _daemons(zygote_daemon.daemon_name(env))
    assert len(daemon) == 1
    second = _attach({**env, "ZYGOTE_TEST_X": "two"})
    again = _first_line(second)
    served_by = psutil.Process(again["ppid"]).ppid()  # a fork of the daemon serves each connection
    out, _ = second.communicate("exit\n", timeout=60)
    assert second.returncode == 0 and again["x"] == "two" and again["pid"] not in (hello["pid"], second.pid)
    assert served_by == daemon[0].pid and _daemons(zygote_daemon.daemon_name(env)) == daemon


def test_a_signal_to_the_stand_in_reaches_the_stage_and_a_killed_stage_ends_its_stand_in_with_that_signal(env):
    proc = _attach(env)
    stage = psutil.Process(_first_line(proc)["pid"])
    assert "zygote attach" in " ".join(psutil.Process(proc.pid).cmdline())
    assert "daemon_child" not in " ".join(psutil.Process(proc.pid).cmdline())  # never taken for the stage
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    _gone(stage.pid)  # ended by the forwarded signal, not orphaned
    proc = _attach(env)
    stage_pid = _first_line(proc)["pid"]
    os.kill(stage_pid, signal.SIGKILL)  # as a fault kills a remote stage: by the pid it reported
    assert proc.wait(30) == -signal.SIGKILL


def test_a_signal_that_comes_as_soon_as_the_stage_reports_still_reaches_it(env):
    """The stage reports its pid as soon as it is forked, before the stand-in's spawn has returned,
    so a sweep may signal the stand-in then: the signal is held and forwarded, never lost with the
    stage left running (CI once saw that: the stand-in died of the signal it had no handler for yet).
    The window is a few hundred microseconds, so this tries ten times, each signalled the moment the
    pid is read; on a quiet machine the old code passed it too."""
    for _ in range(10):
        proc = _attach(env)
        stage = _first_line(proc)["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
        _gone(stage)  # while its stdin is still open: ended by the signal, not by the end of its input
        proc.communicate(timeout=60)


def test_the_off_switch_execs_the_stage_in_place(env):
    proc = _attach({**env, "PARETOPIPE_NO_ZYGOTE": "1"})
    hello = _first_line(proc)
    proc.communicate("exit\n", timeout=60)
    assert hello["pid"] == proc.pid and proc.returncode == 0


@pytest.mark.root
def test_another_user_is_refused_and_the_daemon_serves_its_own_after(env):
    name = zygote_daemon.daemon_name(env)
    proc = _attach(env)
    _first_line(proc)
    assert _as_nobody(name) == b""  # closed at once: no "ready", no fork
    proc.communicate("exit\n", timeout=60)
    mine = _attach(env)
    assert _first_line(mine)["x"] is None
    mine.communicate("exit\n", timeout=60)
    assert mine.returncode == 0


def _gone(pid: int) -> None:
    try:
        psutil.Process(pid).wait(10)  # reaped by the daemon's fork that served it
    except psutil.NoSuchProcess:
        pass


def _as_nobody(name: str) -> bytes:
    """What the daemon answers a connection from another user (uid 65534), read in a fork of this
    process that dropped to that user (the interpreter's own files may be closed to it)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.settimeout(20)
                sock.connect("\0" + name)
                os.write(write, b"[" + sock.recv(100) + b"]")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer.startswith(b"[") and answer.endswith(b"]"), answer
    return answer[1:-1]


def _listening(name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            try:
                sock.connect("\0" + name)
                return
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.02)


def test_a_daemon_exits_once_idle_and_a_second_one_for_the_same_name_leaves_at_once(tmp_path):
    name = f"paretopipe-zygote-test-{os.getpid()}"
    argv = [sys.executable, "-m", "paretopipe.controller.zygote_server", "--listen", name, "--preload", "json",
            "--idle", "1"]
    daemon = subprocess.Popen(argv)
    _listening(name)
    z = zygote.Zygote(["json"], daemon=name)
    try:
        child = z.spawn("json.tool", [], dict(os.environ), stdio=None)
        out, _ = child.communicate('{"a": 1}', timeout=60)
        assert json.loads(out) == {"a": 1} and child.returncode == 0
        assert subprocess.run(argv, timeout=60).returncode == 0  # the name is taken: it leaves
        assert daemon.poll() is None  # still serving: a connection is open
    finally:
        z.close()
    started = time.monotonic()
    assert daemon.wait(30) == 0 and time.monotonic() - started < 10
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock, pytest.raises(ConnectionRefusedError):
        sock.connect("\0" + name)  # the abstract name went with it: nothing on disk to clean up


def test_the_daemons_name_changes_with_the_packages_source_files_and_with_nothing_else(tmp_path, monkeypatch):
    """A changed or shipped tree must not be served by a daemon that imported the old one; a new
    bytecode cache or a stray file is no change of code."""
    package = tmp_path / "paretopipe"
    (package / "controller" / "__pycache__").mkdir(parents=True)
    (package / "controller" / "zygote.py").write_text("# stands in for the module the name is found from\n")
    (package / "units.py").write_text("A = 1\n")
    monkeypatch.setattr(zygote, "__file__", str(package / "controller" / "zygote.py"))
    env = {"PATH": os.environ.get("PATH", "")}
    before = zygote_daemon.daemon_name(env)
    (package / "controller" / "__pycache__" / "zygote.cpython-311.pyc").write_bytes(b"\0")
    (package / "notes.txt").write_text("not code\n")
    assert zygote_daemon.daemon_name(env) == before
    (package / "units.py").write_text("A = 2\n")  # the same size: its time tells
    os.utime(package / "units.py", ns=(1, 1))
    changed = zygote_daemon.daemon_name(env)
    assert changed != before
    assert zygote_daemon.daemon_name({**env, "OMP_NUM_THREADS": "1"}) != changed  # a start-up variable
    assert zygote_daemon.daemon_name({**env, "ZYGOTE_TEST_X": "1"}) == changed  # any other: the request's
