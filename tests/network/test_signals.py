"""Shaping is always removed: SIGHUP, SIGTERM, SIGINT, a second signal during the clean-up, and an SSH
session that drops all leave no qdisc and no ifb behind (tested for real, in a network namespace)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from conftest import PYTHON, ROOT
from lab_helpers import LAB_SKIP, in_host, lab
from paretopipe.network import tc, tctree

# Named per process: pytest-xdist may run two of these tests at once.
NS, DEV, PEER = f"ppsig{os.getpid()}", f"pps{os.getpid() % 100000}a", f"pps{os.getpid() % 100000}b"


@pytest.fixture
def namespace():
    if LAB_SKIP:
        pytest.skip(LAB_SKIP)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    subprocess.run(["ip", "link", "add", DEV, "type", "veth", "peer", "name", PEER], check=True)
    subprocess.run(["ip", "link", "set", DEV, "netns", NS], check=True)
    subprocess.run(["ip", "netns", "exec", NS, "ip", "link", "set", DEV, "up"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        subprocess.run(["ip", "link", "del", PEER], capture_output=True)


def _state() -> str:
    qdiscs = subprocess.run(["ip", "netns", "exec", NS, "tc", "qdisc", "show", "dev", DEV], capture_output=True,
                            text=True).stdout
    links = subprocess.run(["ip", "netns", "exec", NS, "ip", "-o", "link"], capture_output=True, text=True).stdout
    return qdiscs + links


def _wait(predicate, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds}s: {_state()}")
        time.sleep(0.05)


@pytest.mark.parametrize("signals,gap", [([signal.SIGHUP], 0), ([signal.SIGTERM], 0), ([signal.SIGINT], 0),
                                         ([signal.SIGINT, signal.SIGINT], 0.01), ([signal.SIGTERM, signal.SIGINT], 0.01),
                                         ([signal.SIGTERM, signal.SIGINT], 0)],
                         ids=["SIGHUP", "SIGTERM", "SIGINT", "SIGINT-twice", "SIGTERM-then-SIGINT",
                              "SIGTERM-and-SIGINT-at-once"])
def test_a_signal_clears_the_shaping(namespace, signals, gap):
    proc = subprocess.Popen([PYTHON, "network_delay.py", "apply", "--netns", NS, "--dev", DEV, "--rate", "10mbit",
                             "--ingress", "--duration", "120"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait(lambda: "htb" in _state() and tctree.ifb_name(DEV) in _state(), "the profile was applied")
        for i, sig in enumerate(signals):
            if i:
                time.sleep(gap)  # the second signal lands while the first one's handler or clean-up runs
            os.kill(proc.pid, sig)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    state = _state()
    assert "htb" not in state and "ingress" not in state and "ifb-" not in state, state
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.root
@pytest.mark.lab
def test_an_ssh_session_that_drops_clears_the_shaping():
    """The controlling SSH session dies: sshd hangs the session up (SIGHUP) and the tree goes."""
    with lab("ppls", 2, subnet=58) as made:
        ssh = ["ssh", "-tt", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={made.known_hosts}", "-i",
               str(made.key), "--", f"root@{made.address(1)}",
               f"cd {ROOT} && exec {PYTHON} network_delay.py apply --dev eth0 --rate 10mbit --ingress --duration 120"]
        client = subprocess.Popen(ssh, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while "htb" not in in_host(made, 1, "tc", "qdisc", "show", "dev", "eth0").stdout:
                assert time.monotonic() < deadline, "never applied"
                time.sleep(0.1)
            client.kill()  # the connection drops without a goodbye
            deadline = time.monotonic() + 20
            while True:
                shown = in_host(made, 1, "tc", "qdisc", "show", "dev", "eth0").stdout
                links = in_host(made, 1, "ip", "-o", "link").stdout
                if "htb" not in shown and "ingress" not in shown and "ifb-" not in links:
                    break
                assert time.monotonic() < deadline, shown + links
                time.sleep(0.1)
        finally:
            client.kill()
            client.wait(10)


_SWALLOWED = """
import signal, sys
from paretopipe.network import tc
from paretopipe.network.conditions import Direction

class Finaliser:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the handler runs here; what it raises is dropped

with tc.applied(Direction(rate_bps=10e6), sys.argv[2], runner=tc.Runner(netns=sys.argv[1])) as held:
    Finaliser()
    print("the interrupt was swallowed", flush=True)
    held.hold(120)
"""


def test_a_signal_whose_interrupt_a_finaliser_swallowed_still_ends_the_hold(namespace):
    """Python runs a signal handler between any two bytecodes, a __del__'s included, and drops what
    a finaliser raises: the signal must still end the wait and clear the link (a lost SIGTERM kept
    the shaping for the whole --duration once in CI)."""
    proc = subprocess.run([PYTHON, "-c", _SWALLOWED, NS, DEV], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "the interrupt was swallowed" in proc.stdout and "Exception ignored" in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("KeyboardInterrupt: signal SIGTERM"), proc.stderr
    state = _state()
    assert "htb" not in state and "ifb-" not in state, state


def test_after_a_swallowed_interrupt_the_next_signal_still_stops_a_block_that_does_not_hold(namespace):
    """A block that does other work than waiting (a sweep) gets no poll: after a swallowed interrupt
    the user's next Ctrl-C must still stop it and clear the link, not be blocked for good."""
    body = _SWALLOWED.replace("held.hold(120)", "import time; time.sleep(120)")
    proc = subprocess.Popen([PYTHON, "-c", body, NS, DEV], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "the interrupt was swallowed\n"
        time.sleep(tc.SIGNAL_BURST_S + 0.2)  # past the burst that counts as one request to stop
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert err.rstrip().endswith("KeyboardInterrupt: signal SIGINT"), err
    state = _state()
    assert "htb" not in state and "ifb-" not in state, state
