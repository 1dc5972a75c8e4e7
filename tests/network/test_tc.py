"""Network conditions: golden tc commands, real tbf shaping in namespaces, emulated link timing."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, is_root
from paretopipe import units
from paretopipe.errors import NetemError, UsageError
from paretopipe.network import tc as netem, tctree
from paretopipe.network.conditions import get_conditions, load_conditions
from paretopipe.network.emulated import EmulatedLink
from paretopipe.transport import wire

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tc_commands.json").read_text())


def test_profiles_file_has_the_required_profiles_with_sources():
    profiles = load_conditions()
    for name in ("lan", "wifi", "lte", "4g", "3g", "paretopipe-200ms-5mbit", "satellite-geo"):
        assert name in profiles and profiles[name].comment
    assert not profiles["lan"].is_shaped
    anchor = profiles["paretopipe-200ms-5mbit"]
    assert anchor.up.delay_s == 0.2 and anchor.up.rate_bps == 5e6 and anchor.symmetric


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_golden_tc_commands(key):
    """The exact trees for every shipped condition; real netem runs need a kernel with sch_netem."""
    if key == "clear":
        got = tctree.clear_commands("eth0")
    elif key == "change-rate":
        got = tctree.change_rate_commands("eth0", 12e6)
    else:
        name, label = key.split("/")
        c = load_conditions()[name]
        kw = {"port": 5555} if "port" in label else {}
        kw.update({"ingress": c.down} if "ingress" in label else {})
        kw.update({"peers": ["10.0.0.2", "fd00::2"]} if label == "peers" else {})
        got = tctree.apply_commands(c.up, "eth0", **kw)
    assert [str(c) for c in got] == GOLDEN[key]


def test_delay_and_rate_combine_in_one_htb_tree():
    cmds = [c.argv for c in tctree.apply_commands(get_conditions(None, delay="50ms", rate="10mbit").up, "eth0")]
    assert cmds == [
        ("tc", "qdisc", "del", "dev", "eth0", "root"),
        ("tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "2"),
        ("tc", "class", "replace", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit",
         "ceil", "10gbit", "quantum", "60000"),
        ("tc", "class", "replace", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb", "rate", "10mbit",
         "ceil", "10mbit", "burst", "5000", "cburst", "5000", "quantum", "12500"),
        ("tc", "qdisc", "replace", "dev", "eth0", "parent", "1:2", "handle", "20:", "netem", "delay", "50ms",
         "limit", "1000"),
    ]
    # An old tree goes, then every command replaces: applying twice is the same as applying once.
    assert all(c[2] == "replace" for c in cmds[1:])
    assert not any(k in c for c in cmds for k in ("prio", "tbf"))


def test_rate_only_conditions_need_no_netem():
    cmds = [c.argv for c in tctree.apply_commands(get_conditions(None, rate="20mbit").up, "eth0", port=5555)]
    assert not any("netem" in c for c in cmds)
    assert ("tc", "qdisc", "replace", "dev", "eth0", "parent", "1:2", "handle", "20:", "pfifo", "limit", "10000") in cmds


def test_port_mode_leaves_other_traffic_in_the_unshaped_class():
    cmds = [c.argv for c in tctree.apply_commands(get_conditions("lte").up, "eth0", port=5555)]
    assert cmds[1][-2:] == ("default", "1")  # whatever no filter matches is unshaped
    filters = [c for c in cmds if c[1] == "filter" and c[2] == "add"]
    assert {(c[c.index("protocol") + 1], c[-5]) for c in filters} == {
        ("ip", "dport"), ("ip", "sport"), ("ipv6", "dport"), ("ipv6", "sport")}
    assert all(c[-2:] == ("flowid", "1:2") for c in filters)


def test_peer_mode_shapes_the_peers_but_never_ssh():
    cmds = [c.argv for c in tctree.apply_commands(get_conditions("wifi").up, "eth0", peers=["10.0.0.2"], ssh_port=2222)]
    filters = [c for c in cmds if c[1] == "filter" and c[2] == "add"]
    ssh = [c for c in filters if "2222" in c]
    assert len(ssh) == 4 and all(c[-2:] == ("flowid", "1:1") for c in ssh)
    (peer,) = [c for c in filters if "10.0.0.2/32" in c]
    assert peer[-2:] == ("flowid", "1:2") and int(peer[peer.index("prio") + 1]) > max(
        int(c[c.index("prio") + 1]) for c in ssh)  # SSH matches first
    with pytest.raises(UsageError, match="not an IP address"):
        tctree.apply_commands(get_conditions("wifi").up, "eth0", peers=["pi.local"])


def test_asymmetric_conditions_shape_each_direction():
    c = get_conditions("3g")
    assert (c.up.rate_bps, c.down.rate_bps) == (768e3, 1.6e6)
    cmds = [str(x) for x in tctree.apply_commands(c.up, "eth0", ingress=c.down)]
    assert any("dev eth0 parent 1: classid 1:2 htb rate 768kbit" in x for x in cmds)
    assert any("dev ifb-eth0 parent 1: classid 1:2 htb rate 1600kbit" in x for x in cmds)


def test_unshaped_profile_applies_as_a_clear():
    assert tctree.apply_commands(get_conditions("lan").up, "eth0") == tctree.clear_commands("eth0", False)


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
    assert "htb rate 768kbit" in dry.stdout  # this host's egress carries 3G's up direction
    if is_root():
        missing = subprocess.run([PYTHON, "network_delay.py", "clear", "--dev", "nosuch9"],
                                 capture_output=True, text=True, cwd=ROOT)
        assert missing.returncode == 1
        assert missing.stderr.startswith("error: no interface 'nosuch9' on local; interfaces: lo")


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
    sender = FrameSender(wire.FrameWriter(a), EmulatedLink(get_conditions(None, rate="10mbit", delay="50ms").up),
                         "test-send")
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
        wire.recv_frame(b, deadline=time.monotonic() + 10)
        arrivals.append(time.monotonic() - t0)
    sender.close()
    assert expect[0] == pytest.approx(0.85, rel=0.01) and expect[1] == pytest.approx(1.65, rel=0.01)
    # The emulator never delivers early (a floor from the link's arithmetic); it may deliver late by
    # a thread's scheduling delay, for which 150 ms is the stated margin (one busy core costs tens).
    for got, want in zip(arrivals, expect):
        assert want - 0.002 <= got <= want + 0.150, (arrivals, expect)


def test_emulated_jitter_never_reorders_and_loss_costs_retransmissions():
    jittery = EmulatedLink(get_conditions(None, delay="20ms", jitter="15ms").up, seed=1)
    times = [jittery.schedule(100, now=i * 0.001) for i in range(200)]
    assert times == sorted(times)
    lossy = EmulatedLink(get_conditions(None, rate="10mbit", delay="10ms", loss="5%").up, seed=2)
    clean = EmulatedLink(get_conditions(None, rate="10mbit", delay="10ms").up, seed=2)
    assert lossy.schedule(10**6, now=0) > clean.schedule(10**6, now=0) + 0.5  # ~35 lost segments x 20 ms


# -- a lab of namespace hosts: the real tc path -------------------------------------------------------
@pytest.fixture
def lab():
    from lab_helpers import lab as make_lab, serve_probe

    with make_lab("pptc", 2, subnet=51) as made:
        server = serve_probe(made, 2, 5299)
        try:
            yield made
        finally:
            server.kill()
            server.wait(5)


@pytest.mark.alone
def test_lab_htb_rate_is_what_the_link_does_and_clear_restores(lab):
    from lab_helpers import measure

    edge = netem.Runner(netns=lab.namespace(1))
    before = netem.show("eth0", edge)
    p = get_conditions(None, rate="20mbit").up
    netem.apply(p, "eth0", runner=edge)
    once = netem.show("eth0", edge)
    netem.apply(p, "eth0", runner=edge)  # idempotent
    assert netem.show("eth0", edge) == once
    assert once[0]["kind"] == "htb" and [c["rate"] for c in netem.classes("eth0", edge)] == ["10Gbit", "20Mbit"]
    assert "direct_packets_stat" not in once[0]["options"]  # a traffic counter is not configuration
    measured = measure(lab, 1, 2, 5299)
    assert measured["upload_goodput_mbit_per_s"] == pytest.approx(20, rel=0.10)
    netem.clear("eth0", runner=edge)
    assert netem.show("eth0", edge) == before
    netem.clear("eth0", runner=edge)  # a no-op on a clean interface
    assert netem.show("eth0", edge) == before


@pytest.mark.alone
def test_lab_asymmetric_conditions_measure_differently_each_way(lab):
    """3G-like: 10 Mbit/s up, 40 Mbit/s down, each applied on the egress of its own host."""
    from lab_helpers import measure

    c = get_conditions(None, rate="10mbit/40mbit")
    edge, server = netem.Runner(netns=lab.namespace(1)), netem.Runner(netns=lab.namespace(2))
    with netem.applied(c.up, "eth0", runner=edge, port=5299), netem.applied(c.down, "eth0", runner=server, port=5299):
        got = measure(lab, 1, 2, 5299)
    assert got["upload_goodput_mbit_per_s"] == pytest.approx(10, rel=0.10)
    assert got["download_goodput_mbit_per_s"] == pytest.approx(40, rel=0.15)
    assert netem.show("eth0", edge)[0]["kind"] == "noqueue" == netem.show("eth0", server)[0]["kind"]


@pytest.mark.alone
def test_lab_delay_needs_netem(lab):
    from lab_helpers import measure

    edge, server = netem.Runner(netns=lab.namespace(1)), netem.Runner(netns=lab.namespace(2))
    p = get_conditions(None, delay="20ms").up
    if not netem.netem_available(edge):
        with pytest.raises(NetemError, match="no sch_netem"):
            netem.apply(p, "eth0", runner=edge)
        assert netem.show("eth0", edge)[0]["kind"] == "noqueue"  # nothing half-applied
        pytest.skip("this kernel has no sch_netem: delay/jitter cannot be tested for real here "
                    "(the netem commands are covered by the golden tests)")
    with netem.applied(p, "eth0", runner=edge), netem.applied(p, "eth0", runner=server):
        rtt = measure(lab, 1, 2, 5299)["rtt_median_ms"]
    assert rtt == pytest.approx(40, rel=0.10)  # delay on both ends: RTT = 2 x delay
