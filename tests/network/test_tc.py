"""Network conditions: golden tc commands, real tbf shaping in namespaces, emulated link timing."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, is_root
from paretopipe import units
from paretopipe.errors import NetemError, UsageError
from paretopipe.network import tc as netem
from paretopipe.network.conditions import get_conditions, load_conditions
from paretopipe.network.emulated import EmulatedLink
from paretopipe.transport import wire

GOLDEN = json.loads((Path(__file__).parent / "golden" / "netem_commands.json").read_text())


def test_profiles_file_has_the_required_profiles_with_sources():
    profiles = load_conditions()
    for name in ("lan", "wifi", "lte", "4g", "3g", "paretopipe-200ms-5mbit", "satellite-geo"):
        assert name in profiles and profiles[name].comment
    assert not profiles["lan"].is_shaped
    anchor = profiles["paretopipe-200ms-5mbit"]
    assert anchor.up.delay_s == 0.2 and anchor.up.rate_bps == 5e6 and anchor.symmetric


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_tc_commands(key):
    if key == "clear":
        got = netem.clear_commands("eth0")
    else:
        name, label = key.split("/")
        kw = {"port": 5555} if "port" in label else {}
        kw.update({"ingress": True} if "ingress" in label else {})
        got = netem.apply_commands(load_conditions()[name].up, "eth0", **kw)
    assert [str(c) for c in got] == GOLDEN[key]


def test_delay_and_rate_combine_in_one_tree():
    cmds = [c.argv for c in netem.apply_commands(get_conditions(None, delay="50ms", rate="10mbit").up, "eth0")]
    assert cmds == [
        ("tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "netem", "delay", "50ms", "limit", "1000"),
        ("tc", "qdisc", "replace", "dev", "eth0", "parent", "1:1", "handle", "2:", "tbf", "rate", "10mbit",
         "burst", "5000", "limit", "125000"),
    ]
    # Every command replaces: applying twice is the same as applying once.
    assert all(c[2] == "replace" for c in cmds)


def test_port_mode_leaves_other_traffic_in_an_unshaped_band():
    cmds = [c.argv for c in netem.apply_commands(get_conditions("lte").up, "eth0", port=5555)]
    root = cmds[0]
    assert root[-17:] == ("priomap",) + ("0",) * 16  # no priority escapes into a shaped band
    filters = [c for c in cmds if c[1] == "filter" and c[2] == "add"]
    assert {(c[c.index("protocol") + 1], c[-5]) for c in filters} == {
        ("ip", "dport"), ("ip", "sport"), ("ipv6", "dport"), ("ipv6", "sport")}
    assert all(c[-2:] == ("flowid", "1:3") for c in filters)


def test_unshaped_profile_applies_as_a_clear():
    assert netem.apply_commands(get_conditions("lan").up, "eth0") == netem.clear_commands("eth0", False)


def test_bad_input_gives_clear_errors(monkeypatch):
    with pytest.raises(UsageError, match=r"unknown network 'moon'; known: lan, wifi, lte"):
        get_conditions("moon")
    with pytest.raises(UsageError, match=r"accepted units are bit, kbit, mbit.*bytes per second in tc"):
        units.parse_rate("10mbps")
    with pytest.raises(UsageError, match="bad duration"):
        units.parse_duration("10 parsecs")
    with pytest.raises(UsageError, match="within 0..100"):
        units.parse_percent("120%")
    monkeypatch.setattr(netem.os, "geteuid", lambda: 1000)
    with pytest.raises(NetemError, match="needs root.*--dry-run"):
        netem.apply(get_conditions("lte").up, "eth0")


def test_cli_dry_run_and_missing_interface():
    dry = subprocess.run([PYTHON, "network_delay.py", "apply", "--network", "3g", "--dev", "eth0", "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT)
    assert dry.returncode == 0 and "netem delay 150ms 20ms distribution normal" in dry.stdout
    if is_root():
        missing = subprocess.run([PYTHON, "network_delay.py", "clear", "--dev", "nosuch9"],
                                 capture_output=True, text=True, cwd=ROOT)
        assert missing.returncode == 1
        assert missing.stderr.startswith("error: no interface 'nosuch9' here; interfaces: lo")


# -- emulated link -------------------------------------------------------------------------------
def test_emulated_link_schedule_matches_a_real_link():
    p = get_conditions(None, rate="10mbit", delay="50ms").up
    lk = EmulatedLink(p)
    assert lk.schedule(10**6, now=100.0) == pytest.approx(100.85)
    lk = EmulatedLink(p)
    first, second = lk.schedule(10**6, now=0.0), lk.schedule(10**6, now=0.0)
    assert (first, second) == (pytest.approx(0.85), pytest.approx(1.65))


def test_emulated_link_timing_through_real_sockets():
    """Two 1 MB frames sent at once over 10 Mbit/s + 50 ms arrive at ~0.85 s and ~1.65 s."""
    from paretopipe.transport.tcp import FrameSender

    a, b = socket.socketpair()
    sender = FrameSender(a, EmulatedLink(get_conditions(None, rate="10mbit", delay="50ms").up), "test-send")
    import torch

    payload = torch.zeros(10**6, dtype=torch.uint8)
    frame = wire.encode(wire.TENSOR, 0, payload)
    # Frame overhead is part of what the link carries; account for it exactly.
    expect = [(k * frame.total_nbytes) * 8 / 10e6 + 0.05 for k in (1, 2)]
    t0 = time.monotonic()
    sender.submit(frame)
    sender.submit(wire.encode(wire.TENSOR, 1, payload))
    arrivals = []
    for _ in range(2):
        wire.recv_frame(b)
        arrivals.append(time.monotonic() - t0)
    sender.close()
    assert arrivals[0] == pytest.approx(0.85, rel=0.05) and arrivals[0] == pytest.approx(expect[0], rel=0.05)
    assert arrivals[1] == pytest.approx(1.65, rel=0.05) and arrivals[1] == pytest.approx(expect[1], rel=0.05)


def test_emulated_jitter_never_reorders_and_loss_costs_retransmissions():
    jittery = EmulatedLink(get_conditions(None, delay="20ms", jitter="15ms").up, seed=1)
    times = [jittery.schedule(100, now=i * 0.001) for i in range(200)]
    assert times == sorted(times)
    lossy = EmulatedLink(get_conditions(None, rate="10mbit", delay="10ms", loss="5%").up, seed=2)
    clean = EmulatedLink(get_conditions(None, rate="10mbit", delay="10ms").up, seed=2)
    assert lossy.schedule(10**6, now=0) > clean.schedule(10**6, now=0) + 0.5  # ~35 lost segments x 20 ms


# -- namespace lab: the real tc path -------------------------------------------------------------
def _lab_available() -> str | None:
    if not is_root():
        return "needs root for network namespaces"
    if shutil.which("tc") is None or shutil.which("ip") is None:
        return "iproute2 (tc, ip) not installed"
    probe = subprocess.run(["ip", "netns", "add", "pp-probe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "pp-probe"], capture_output=True)
    return None if probe.returncode == 0 else f"cannot create namespaces: {probe.stderr.strip()}"


LAB_SKIP = _lab_available()
LAB_ENV = {"PP_LAB_EDGE_NS": "ppt-edge", "PP_LAB_SERVER_NS": "ppt-server", "PP_LAB_EDGE_IF": "ppt-edge0",
           "PP_LAB_SERVER_IF": "ppt-server0", "PP_LAB_EDGE_IP": "10.213.9.1", "PP_LAB_SERVER_IP": "10.213.9.2"}


@pytest.fixture
def lab():
    if LAB_SKIP:
        pytest.skip(LAB_SKIP)
    import os

    env = {**os.environ, **LAB_ENV}
    subprocess.run(["bash", str(ROOT / "netem" / "lab.sh"), "up"], check=True, env=env, capture_output=True)
    server = subprocess.Popen(["ip", "netns", "exec", "ppt-server", PYTHON, "network_delay.py", "serve",
                               "--host", "10.213.9.2", "--port", "5299"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    server.stdout.readline()  # readiness: it prints once it listens
    try:
        yield netem.Runner(netns="ppt-edge")
    finally:
        server.kill()
        server.wait(5)
        subprocess.run(["bash", str(ROOT / "netem" / "lab.sh"), "down"], env=env, capture_output=True)


def _measure():
    out = subprocess.run(["ip", "netns", "exec", "ppt-edge", PYTHON, "network_delay.py", "measure",
                          "--host", "10.213.9.2", "--port", "5299", "--bytes", "4000000", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_lab_tbf_rate_is_what_the_link_does_and_clear_restores(lab):
    before = netem.show("ppt-edge0", lab)
    p = get_conditions(None, rate="20mbit").up
    netem.apply(p, "ppt-edge0", runner=lab)
    once = netem.show("ppt-edge0", lab)
    netem.apply(p, "ppt-edge0", runner=lab)  # idempotent
    assert netem.show("ppt-edge0", lab) == once
    assert once[0]["kind"] == "tbf" and once[0]["options"]["rate"] == 2_500_000
    measured = _measure()
    assert measured["upload_goodput_mbit_per_s"] == pytest.approx(20, rel=0.10)
    netem.clear("ppt-edge0", runner=lab)
    assert netem.show("ppt-edge0", lab) == before
    netem.clear("ppt-edge0", runner=lab)  # a no-op on a clean interface
    assert netem.show("ppt-edge0", lab) == before


def test_lab_delay_needs_netem(lab):
    p = get_conditions(None, delay="20ms").up
    if not netem.netem_available(lab):
        with pytest.raises(NetemError, match="no sch_netem"):
            netem.apply(p, "ppt-edge0", runner=lab)
        pytest.skip("this kernel has no sch_netem: delay/jitter cannot be tested for real here "
                    "(the netem commands are covered by the golden tests)")
    server = netem.Runner(netns="ppt-server")
    with netem.applied(p, "ppt-edge0", runner=lab), netem.applied(p, "ppt-server0", runner=server):
        rtt = _measure()["rtt_median_ms"]
    assert rtt == pytest.approx(40, rel=0.10)  # delay on both ends: RTT = 2 x delay
