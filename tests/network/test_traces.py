"""Rate traces: both formats, the shipped generated traces, the shared recorded ones, and an exact
replay by the emulated link over a real socket."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from conftest import PYTHON, ROOT
from paretopipe.errors import UsageError
from paretopipe.network import tracegen, traces
from paretopipe.network.conditions import Direction, conditions_from_values
from paretopipe.network.emulated import EmulatedLink, LinkSender

SHIPPED = traces.shipped_dir()
SHARED = ROOT.parent / "shared" / "traces"
# The capacities the shared traces' README states (Mbit/s, up / down).
SHARED_MEANS = {"ATT-LTE-driving-2016": (1.91, 4.56), "TMobile-LTE-short": (13.32, 16.70),
                "Verizon-EVDO-driving": (0.84, 0.52)}


def test_csv_trace_integral_is_exact_across_steps(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time_s,rate_mbit,delay_ms\n0,12,5\n1,1.2,40\n2,0,10\n")
    t = traces.load(path)
    assert t.format == "csv" and t.period_s == 3.0
    assert t.bytes_between(0, 1) == pytest.approx(12e6 / 8, abs=1500)
    assert t.bytes_between(1, 2) == pytest.approx(1.2e6 / 8, abs=1500)
    assert t.bytes_between(2.001, 3) == 0  # a zero-rate step delivers nothing (2.000 ends the last packet)
    assert t.bytes_between(3, 4) == pytest.approx(12e6 / 8, abs=1500)  # and the trace repeats
    assert (t.delay_s(0.5), t.delay_s(1.5), t.delay_s(3.5)) == (0.005, 0.04, 0.005)


def test_mahimahi_trace_repeats_with_its_last_line_as_period(tmp_path):
    path = tmp_path / "m.up"
    path.write_text("0\n0\n5\n10\n")  # 2 packets at 0 ms, one at 5 ms, period 10 ms
    t = traces.load(path)
    assert t.format == "mahimahi" and t.period_ms == 10 and len(t.opportunities_ms) == 3
    assert t.mean_rate_bps == pytest.approx(3 * 1500 * 8 / 0.010)
    assert t.first_at_or_after(0.010) == 3 and t.first_at_or_after(0.0101) == 5
    assert t.opportunity_s(5) == pytest.approx(0.015)


@pytest.mark.parametrize("text, message", [
    ("", "is empty"), ("5\n3\n", "never decrease"), ("0\n0\n", "must be > 0 ms"), ("1.5\n3\n", "whole number"),
    ("time_s,rate_mbit\n1,5\n", "first row must be at time 0"), ("0,5\n0,6\n", "times must increase"),
    ("0,-1\n", ">= 0"), ("0,abc\n", "not a number"), ("0,0\n1,0\n", "every rate is 0"), ("0,1,2,3\n", "expected time_s"),
])
def test_bad_traces_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.trace"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        traces.load(path)


def test_a_trace_is_the_rate_so_both_are_refused():
    with pytest.raises(UsageError, match="a rate or a trace, not both"):
        conditions_from_values("x", {"rate": "10mbit", "trace": str(SHIPPED / "step.csv")})
    cond = conditions_from_values("x", {"delay": "20ms", "trace_up": "step.csv"}, SHIPPED)
    assert cond.up.trace == str(SHIPPED / "step.csv") and cond.down.trace is None and cond.up.delay_s == 0.02


def test_shipped_traces_are_exactly_the_generators_output(tmp_path):
    for path in tracegen.write(tmp_path):
        assert path.read_bytes() == (SHIPPED / path.name).read_bytes(), path.name
    step = traces.load(SHIPPED / "step.csv")
    fast, slow = tracegen.STEP_MBIT
    assert step.rate_bps(0, tracegen.STEP_S) == pytest.approx(fast * 1e6, rel=0.001)
    assert step.rate_bps(tracegen.STEP_S, 2 * tracegen.STEP_S) == pytest.approx(slow * 1e6, rel=0.001)
    # The Markov model swings tenfold: compare 1-second windows of the uplink.
    up = traces.load(SHIPPED / "markov-cellular.up")
    rates = [up.rate_bps(s, s + 1) for s in range(int(up.period_s))]
    assert max(rates) / min(rates) > 5


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared recorded traces are not here ({SHARED})")
@pytest.mark.parametrize("name", sorted(SHARED_MEANS))
def test_shared_recorded_traces_read_at_their_stated_capacity(name):
    for which, stated in zip(("up", "down"), SHARED_MEANS[name]):
        t = traces.load(SHARED / f"{name}.{which}")
        assert t.format == "mahimahi"
        assert t.mean_rate_bps / 1e6 == pytest.approx(stated, abs=0.01), (name, which)


# It times a real socket against the trace: with the parallel pass's four workers on two cores,
# the receiver once lagged the trace by more than the 0.3 s allowed (seen in CI), so it runs alone.
@pytest.mark.alone
def test_emulated_link_replays_a_trace_at_its_integral_over_a_real_socket():
    """A backlog sent through the emulated link over a socket pair: by every time, the bytes
    received never exceed the trace's capacity up to then (the link never delivers early) and are
    at least its capacity up to 300 ms before (the stated margin for a sender thread made late by
    one busy core: 136 ms was seen with qemu holding one of the two), on both sides of a 40 -> 2
    Mbit/s step."""
    trace = traces.load(SHIPPED / "step.csv")
    offset = tracegen.STEP_S - 1.0  # one second of the fast rate, then the slow one
    origin = time.monotonic() + 0.2
    link = EmulatedLink(Direction(trace=str(SHIPPED / "step.csv")),
                        schedule=traces.TraceSchedule(trace, origin, offset))
    a, b = socket.socketpair()
    arrivals: list[tuple[float, int]] = []

    def receive():
        while True:
            data = b.recv(1 << 20)
            if not data:
                return
            arrivals.append((time.monotonic(), len(data)))

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    sender = LinkSender(link, "trace-test")
    message = b"x" * 3000
    while time.monotonic() < origin:
        time.sleep(0.01)
    for _ in range(2200):  # more than 2.6 s of the trace can carry: the link is never idle
        sender.submit(len(message), lambda: a.sendall(message))
    time.sleep(2.7)
    sender.close(timeout=0.1)
    a.close()

    def received(t0, t1):
        return sum(n for t, n in arrivals if origin + t0 <= t < origin + t1)

    for t in (0.5, 0.9, 1.5, 2.0, 2.6):
        got = received(-1.0, t)
        assert trace.bytes_between(offset, offset + t - 0.3) <= got, t
        assert got <= trace.bytes_between(offset, offset + t) + len(message), t
    assert EmulatedLink(Direction(trace=str(SHIPPED / "step.csv")), seed=3).manifest()["trace"]["offset_s"] == \
        EmulatedLink(Direction(trace=str(SHIPPED / "step.csv")), seed=3).manifest()["trace"]["offset_s"]


def test_netem_apply_refuses_a_trace_without_a_duration():
    proc = subprocess.run([PYTHON, "network_delay.py", "apply", "--trace", str(SHIPPED / "step.csv"), "--dev", "lo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give --duration" in proc.stderr and "Traceback" not in proc.stderr


RECEIVER = """
import json, socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
conn, _ = srv.accept()
bins = {}
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    key = round(time.monotonic(), 2)
    bins[key] = bins.get(key, 0) + len(data)
print(json.dumps(bins))
"""

SENDER = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
end = time.monotonic() + float(sys.argv[3])
chunk = b"x" * 65536
while time.monotonic() < end:
    sock.sendall(chunk)
sock.close()
"""


@pytest.mark.alone
@pytest.mark.root
@pytest.mark.lab
def test_tc_controller_follows_a_step_trace_in_the_lab(tmp_path):
    """Real htb in a lab host, its rate stepped by the controller every 100 ms: TCP goodput from
    that host on each side of a 20 -> 5 Mbit/s step is within 10% of each rate."""
    import json

    from lab_helpers import lab

    trace = tmp_path / "step.csv"
    trace.write_text("time_s,rate_mbit\n0,20\n3,5\n")
    log = tmp_path / "rates.csv"
    with lab("pptr", 2, subnet=57) as made:
        port = "5301"
        recv = subprocess.Popen(["ip", "netns", "exec", made.namespace(2), PYTHON, "-c", RECEIVER, made.address(2), port],
                                stdout=subprocess.PIPE, text=True)
        assert recv.stdout.readline().strip() == "ready"
        shaper = subprocess.Popen([PYTHON, "network_delay.py", "apply", "--netns", made.namespace(1), "--dev", "eth0",
                                   "--trace", str(trace), "--trace-offset", "0", "--duration", "6.5", "--trace-log",
                                   str(log)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = shaper.stdout.readline()
            t0 = time.monotonic()
            assert "applied" in line, shaper.stderr.read()
            sender = subprocess.run(["ip", "netns", "exec", made.namespace(1), PYTHON, "-c", SENDER, made.address(2),
                                     port, "5.9"], capture_output=True, text=True, timeout=60)
            assert sender.returncode == 0, sender.stderr
            bins = {float(k): v for k, v in json.loads(recv.communicate(timeout=60)[0]).items()}
            out, err = shaper.communicate(timeout=60)
        finally:
            for p in (recv, shaper):
                if p.poll() is None:
                    p.kill()
        assert shaper.returncode == 0, err
        assert "rate changes every 0.1s" in out and "cleared eth0" in out

    def goodput(a, b):
        return sum(n for t, n in bins.items() if t0 + a <= t < t0 + b) * 8 / (b - a)

    assert goodput(0.8, 2.8) == pytest.approx(20e6, rel=0.10)
    assert goodput(3.8, 5.8) == pytest.approx(5e6, rel=0.10)
    rows = log.read_text().splitlines()
    assert rows[0] == "step,trace_time_s,rate_bps,late_s" and len(rows) > 50  # every 100 ms for 6.5 s
    applied = {round(float(r.split(",")[1]), 1): float(r.split(",")[2]) for r in rows[1:]}
    # 1500-byte opportunities quantise a 100 ms window to 120 kbit/s; the trace repeats after 6 s.
    assert applied[1.0] == pytest.approx(20e6, rel=0.01) and applied[4.0] == pytest.approx(5e6, rel=0.03)


def test_the_cost_model_refuses_a_trace_rather_than_treat_it_as_unshaped():
    from paretopipe.predict.costmodel import LinkModel

    with pytest.raises(UsageError, match="does not model"):
        LinkModel.pair(conditions_from_values("t", {"trace": "step.csv"}, SHIPPED))
