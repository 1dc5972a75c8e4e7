"""The fork server the sweep starts its local stages from: real forks, real pipes, real signals."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from paretopipe.controller import zygote

CHILD = '''
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "x": os.environ.get("ZYGOTE_TEST_X"),
                  "leader": os.getsid(0) == os.getpid(), "main": __name__}), flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    print(line.strip().upper(), flush=True)
code = sys.argv[1] if len(sys.argv) > 1 else "0"
sys.exit(int(code) if code.lstrip("-").isdigit() else code)
'''


@pytest.fixture
def server(tmp_path):
    (tmp_path / "zygote_child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    z = zygote.Zygote(preload=["json"], env=env)
    yield z, env
    z.close()


def test_a_forked_stage_has_its_own_pipes_session_env_cwd_and_exit_code(server, tmp_path):
    z, env = server
    work = tmp_path / "work"
    work.mkdir()
    before = os.getcwd()  # later tests on this worker resolve paths from it
    os.chdir(work)
    try:
        child = z.spawn("zygote_child", ["7", "--role", "stage2"], {**env, "ZYGOTE_TEST_X": "forked"})
    finally:
        os.chdir(before)
    hello = json.loads(child.stdout.readline())
    assert hello == {"argv": ["7", "--role", "stage2"], "cwd": str(work), "x": "forked", "leader": True,
                     "main": "__main__"}
    # ps shows the stage's own command line, not the zygote's
    assert "zygote_child 7 --role stage2" in " ".join(psutil.Process(child.pid).cmdline())
    child.stdin.write("ping\n")
    assert child.stdout.readline() == "PING\n"
    assert child.poll() is None
    child.stdin.write("exit\n")
    assert child.wait(10) == 7 and child.poll() == 7
    assert psutil.Process(z._proc.pid).is_running()  # the zygote serves on


def test_a_message_exit_a_signal_and_a_closed_stdin_end_a_child_as_they_end_a_process(server):
    z, env = server
    told = z.spawn("zygote_child", ["bad input, valid: good"], env)
    told.stdin.write("exit\n")
    assert told.wait(10) == 1 and "bad input, valid: good" in told.stderr.read()
    killed = z.spawn("zygote_child", [], env)
    json.loads(killed.stdout.readline())
    os.killpg(killed.pid, signal.SIGTERM)  # the sweep stops a stage by its process group
    assert killed.wait(10) == -signal.SIGTERM
    orphaned = z.spawn("zygote_child", ["3"], env)
    orphaned.stdin.close()
    assert orphaned.wait(10) == 3
    with pytest.raises(subprocess.TimeoutExpired):
        z.spawn("zygote_child", [], env).wait(0.2)


def test_the_zygote_ends_with_its_sweep_and_its_children_end_at_their_eof(server):
    z, env = server
    child = z.spawn("zygote_child", ["0"], env)
    json.loads(child.stdout.readline())
    zpid = z._proc.pid
    z.close()
    assert not psutil.pid_exists(zpid) or psutil.Process(zpid).status() == psutil.STATUS_ZOMBIE
    assert psutil.Process(child.pid).is_running()  # a stage outlives the zygote until its stdin ends
    child.stdin.close()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child.pid) and psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child did not end at EOF"
        time.sleep(0.05)
    with pytest.raises(OSError):
        z.spawn("zygote_child", [], env)


def test_a_different_startup_variable_or_the_off_switch_gives_a_plain_process(server, monkeypatch):
    z, env = server
    assert z.usable_for({**env, "ZYGOTE_TEST_X": "any"})  # read at run time: a fork can set it
    assert not z.usable_for({**env, "OMP_NUM_THREADS": "3"})  # read when the library loads: it cannot
    assert not z.usable_for({**env, "PYTHONPATH": "/elsewhere"})
    assert not z.usable_for({**env, "TMPDIR": "/elsewhere"})  # tempfile keeps the first folder it found
    monkeypatch.setenv("PARETOPIPE_NO_ZYGOTE", "1")
    proc = zygote.launch([sys.executable, "-c", "import sys; print(sys.stdin.readline().upper())"], None)
    assert isinstance(proc, subprocess.Popen)
    out, _ = proc.communicate("plain\n", timeout=30)
    assert out.strip() == "PLAIN" and proc.returncode == 0


def test_a_request_without_its_descriptors_is_refused_and_the_zygote_serves_on(server):
    z, env = server
    z.spawn("zygote_child", ["0"], env).stdin.close()  # started
    z._sock.send(b'{"module": "zygote_child"}')
    assert "three descriptors" in z._next_reply(10)["error"]
    child = z.spawn("zygote_child", ["5"], env)
    child.stdin.close()
    assert child.wait(10) == 5


def test_a_script_runs_as_python_script_would_and_communicate_collects_its_output(server, tmp_path):
    z, env = server
    child = z.spawn(None, ["4"], env, cwd=str(tmp_path), script=str(tmp_path / "zygote_child.py"))
    out, err = child.communicate("hi\nexit\n", timeout=10)
    hello, echoed = out.splitlines()
    assert json.loads(hello) == {"argv": ["4"], "cwd": str(tmp_path), "x": None, "leader": True, "main": "__main__"}
    assert echoed == "HI" and err == "" and child.returncode == 4


NESTED = '''
import json, os, sys
from paretopipe.controller import zygote
own = zygote.Zygote(preload=["json"])
child = own.spawn("zygote_child", ["5"], dict(os.environ))
hello = json.loads(child.stdout.readline())
import psutil
helper = psutil.Process(psutil.Process(child.pid).ppid())
child.stdin.write("exit\\n")
child.stdin.flush()
print(json.dumps({"parent": os.getppid(), "fresh": own._proc is not None, "grandchild": hello["argv"],
                  "code": child.wait(10), "helper": helper.pid, "helper_parent": helper.ppid()}), flush=True)
own.close()
'''


def test_a_forked_process_gets_its_own_zygote_by_a_fork_not_a_new_interpreter(server, tmp_path):
    """A sweep forked from a zygote (as the tests' CLIs are) asks that zygote for one of its own:
    the zygote forks it from its imported state, and the sweep's stages come from there."""
    z, env = server
    (tmp_path / "nested_sweep.py").write_text(NESTED)
    child = z.spawn("nested_sweep", [], env)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    got = json.loads(out)
    assert not got["fresh"] and got["grandchild"] == ["5"] and got["code"] == 5
    # The stage's zygote is a child of the first zygote, which started no second interpreter.
    assert got["helper_parent"] == z._proc.pid == got["parent"] and got["helper"] != z._proc.pid
    assert psutil.Process(z._proc.pid).is_running()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(got["helper"]):  # it ends with its sweep, and its zygote reaps it
        assert time.monotonic() < deadline, "the helper zygote outlived its sweep"
        time.sleep(0.05)


# Plays the sweep against a zygote process in a pid namespace of its own (no other process forks
# there), then asks the kernel for the ended child's pid for a new process (ns_last_pid): while the
# sweep has not read the exit, that pid must stay the child's, as a Popen's stays until its wait.
PID_REUSE = '''
import json, os, socket, subprocess, sys
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
zyg = subprocess.Popen([sys.executable, "-m", "paretopipe.controller.zygote_server", "--fd", str(theirs.fileno()),
                        "--preload", "json"], pass_fds=[theirs.fileno()])
theirs.close()
assert "ready" in json.loads(mine.recv(65536))
null = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
req = {"module": None, "script": sys.argv[1], "args": [], "env": dict(os.environ), "cwd": os.getcwd()}
socket.send_fds(mine, [json.dumps(req).encode()], null)
pid = json.loads(mine.recv(65536))["pid"]
ended = json.loads(mine.recv(65536))

def state():
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None

held = state()
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(pid - 1))
newcomer = subprocess.Popen(["true"])
newcomer.wait()
mine.send(json.dumps({"reap": pid}).encode())
for _ in range(200):
    if state() is None:
        break
    import time; time.sleep(0.01)
print(json.dumps({"pid": pid, "ended": ended, "held": held, "newcomer": newcomer.pid, "after_reap": state()}))
mine.close()
zyg.wait(10)
'''


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and util-linux's unshare for a pid namespace")
def test_an_ended_childs_pid_is_not_given_to_another_process_before_the_sweep_reads_its_exit(tmp_path):
    """The race behind a CI failure (ForkedProcess.poll() gave a live stage's pid someone else's exit
    status): the zygote freed a child's pid the moment the child ended, so the pid could go to a new
    process while the sweep still held it for that child; a signal or a status by pid then met the
    wrong process. Now the zygote keeps the ended child a zombie until the sweep says it has read the
    exit, as a Popen's pid stays reserved until its wait. The kernel is asked outright to reuse the pid."""
    (tmp_path / "ends.py").write_text("import sys; sys.exit(3)\n")
    (tmp_path / "play.py").write_text(PID_REUSE)
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(tmp_path / "play.py"),
                          str(tmp_path / "ends.py")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ended"] == {"exit": got["pid"], "code": 3}
    assert got["newcomer"] != got["pid"]  # asked for, the pid went elsewhere: it was still taken
    assert got["held"] == "Z"  # by the ended child, reported and kept as a zombie
    assert got["after_reap"] is None  # the sweep's word frees it


def test_the_tests_zygote_forks_for_the_environment_each_test_begins_with_whichever_test_started_it(monkeypatch):
    """tests/tcp_helpers.py: a zygote first started inside a test that had changed a start-up variable
    (a library's first import: scikit-learn's sets ``KMP_INIT_AT_FORK``) starts with the variables
    every test begins with, so it still forks for the tests after that one; before, it took the
    test's, and refused every later fork on its worker."""
    import tcp_helpers

    monkeypatch.setattr(tcp_helpers, "_zygote", None)  # a new one, as on a worker's first use
    monkeypatch.setattr(tcp_helpers, "CLI_PRELOAD", ("json",))
    monkeypatch.setenv("KMP_ZYGOTE_TEST", "1")  # this test's own change, after collection
    argv = [sys.executable, "-m", "json.tool"]
    try:
        inside = tcp_helpers.popen(argv)
        inside.communicate("{}", timeout=60)
        monkeypatch.delenv("KMP_ZYGOTE_TEST")  # as conftest puts it back after each test
        after = tcp_helpers.popen(argv)
        out, _ = after.communicate('{"a": 1}', timeout=60)
    finally:
        if tcp_helpers._zygote is not None:
            tcp_helpers._zygote.close()
    assert isinstance(inside, subprocess.Popen)  # its start-up variables are not the zygote's
    assert isinstance(after, zygote.ForkedProcess) and after.returncode == 0 and json.loads(out) == {"a": 1}


def test_a_library_that_sets_a_startup_variable_gets_later_stages_a_zygote_of_their_own(monkeypatch, tmp_path):
    """OpenCV's import sets LD_LIBRARY_PATH in os.environ as a sweep runs: the stages started after
    that are forked from a zygote started with the new value (as a fresh interpreter would start),
    the first zygote still forks for the old one, and past MAX_ZYGOTES a stage starts plainly."""
    monkeypatch.setattr(zygote, "_shared", {})
    monkeypatch.setattr(zygote, "PRELOAD", ("json",))
    monkeypatch.setattr(zygote, "MAX_ZYGOTES", 2)
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(os.environ.get('LD_LIBRARY_PATH'), sys.stdin.readline().strip())\n")
    argv, before = [sys.executable, str(script)], os.environ.get("LD_LIBRARY_PATH")

    def started(value: str | None, expect_fork: bool = True):
        if value is None:
            monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
        else:
            monkeypatch.setenv("LD_LIBRARY_PATH", value)
        proc = zygote.launch(argv, None)
        assert isinstance(proc, zygote.ForkedProcess) == expect_fork, type(proc)
        parent = psutil.Process(proc.pid).ppid() if expect_fork else None
        out, _ = proc.communicate("go\n", timeout=30)
        assert out.split() == [str(value), "go"] and proc.returncode == 0
        return parent

    try:
        first = started(before)
        second = started(str(tmp_path))
        assert started(before) == first != second  # the first zygote forks for the old value still
        zygotes = {z._proc.pid: z for z in zygote._shared.values()}
        assert set(zygotes) == {first, second}
        assert zygotes[second].env.get("LD_LIBRARY_PATH") == str(tmp_path)  # its interpreter started with it
        started(str(tmp_path / "third"), expect_fork=False)  # past MAX_ZYGOTES: a plain start
    finally:
        for z in zygote._shared.values():
            z.close()


LOADED = '''
import json, sys
print(json.dumps({name: name in sys.modules for name in sys.argv[1:]}), flush=True)
'''
HEAVY = '''
import os, sys
with open(os.environ["ZYGOTE_HEAVY_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
'''


@pytest.mark.parametrize("started", [False, True], ids=["before-its-start", "while-it-runs"])
def test_a_workloads_modules_are_imported_once_by_the_zygote_before_the_stages_it_forks(server, tmp_path, started):
    """An LM sweep's stages import transformers (1.4 s of CPU each here): the sweep has its zygote
    import its workload's modules once (``Workload.preload``), at its start or while it runs; a
    module that fails to import leaves it serving, for the stage to report."""
    z, env = server
    (tmp_path / "zygote_loaded.py").write_text(LOADED)
    (tmp_path / "zygote_heavy.py").write_text(HEAVY)
    log = tmp_path / "heavy.log"
    env = {**env, "ZYGOTE_HEAVY_LOG": str(log)}
    z.env["ZYGOTE_HEAVY_LOG"] = str(log)
    if started:
        before = z.spawn("zygote_loaded", ["zygote_heavy"], env)
        assert json.loads(before.stdout.readline()) == {"zygote_heavy": False} and before.wait(30) == 0
    z.preload_more(["zygote_heavy", "no_such_module_anywhere"])
    for _ in range(2):
        child = z.spawn("zygote_loaded", ["zygote_heavy", "no_such_module_anywhere"], env)
        assert json.loads(child.stdout.readline()) == {"zygote_heavy": True, "no_such_module_anywhere": False}
        assert child.wait(30) == 0
    assert log.read_text().split() == [str(z._proc.pid)]  # imported once, in the zygote


def test_a_language_models_preload_holds_the_code_of_every_named_language_model():
    import importlib

    from paretopipe.llm import shapes
    from paretopipe.workload import GENERATION, IMAGES

    assert IMAGES.preload == ()
    for shape in shapes.NAMED.values():
        assert f"transformers.models.{shape.architecture}.modeling_{shape.architecture}" in GENERATION.preload, shape
    for name in GENERATION.preload:
        importlib.import_module(name)


HOARD = '''
HOARD = [[i] for i in range(50_000)]  # objects the zygote holds at every fork, as torch's are
'''

COLLECTED = '''
import gc, json, weakref
import zygote_hoard

class Node:
    pass

made = Node()
made.self = made  # a cycle of the child's own, which only the collector frees
gone = weakref.ref(made)
del made
gc.collect()
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                  "hoard": len(zygote_hoard.HOARD), "own_cycle_freed": gone() is None}), flush=True)
'''


def test_a_forked_child_s_collector_passes_over_the_zygote_s_objects_and_still_frees_its_own(server, tmp_path):
    """The zygote freezes what it holds before each fork (``gc.freeze``): a stage's first full
    collection otherwise walked torch's half-million objects, 0.3 s of CPU and a copy of every page
    it touched. The child's collector still frees the cycles the child makes."""
    z, env = server
    (tmp_path / "zygote_hoard.py").write_text(HOARD)
    (tmp_path / "zygote_collected.py").write_text(COLLECTED)
    z.preload_more(["zygote_hoard"])
    child = z.spawn(None, [], env, script=str(tmp_path / "zygote_collected.py"))
    seen = json.loads(child.stdout.readline())
    assert child.wait(30) == 0
    assert seen["hoard"] == 50_000 and seen["own_cycle_freed"], seen
    assert seen["frozen"] >= 50_000 and seen["tracked"] < 50_000, seen


def test_a_child_with_its_own_tmpdir_gets_that_folder_for_its_temporary_files(tmp_path):
    """The test process's zygote has imported torch, which asked tempfile for its folder: a child
    started with another TMPDIR must still make its temporary files there (a fresh interpreter)."""
    import tcp_helpers

    script, mine = tmp_path / "where.py", tmp_path / "mine"
    script.write_text("import tempfile\nprint(tempfile.gettempdir())\n")
    mine.mkdir()
    done = tcp_helpers.run([sys.executable, str(script)], cwd=tmp_path, env={**os.environ, "TMPDIR": str(mine)},
                           timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(mine), done.stdout + done.stderr
