"""The relay that carries a foreign peer's connections over the emulated link: real sockets on
loopback, an echo server behind it, and the relay as a real process under ``paretopipe netem relay``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import PYTHON, ROOT
from tcp_helpers import STARTED, free_port, wait_for_line
from paretopipe.network.conditions import Direction
from paretopipe.network.relay import LinkRelay


def _echo_server(port: int | None = None) -> tuple[socket.socket, int]:
    """An echo server on 127.0.0.1 that answers each read with the same bytes, in a thread."""
    server = socket.create_server(("127.0.0.1", port or 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def _ping(port: int, payload: bytes, times: int) -> list[bytes]:
    """``times`` request-reply turns of ``payload`` through 127.0.0.1:``port``; the replies."""
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(times):
            s.sendall(payload)
            got = b""
            while len(got) < len(payload):
                chunk = s.recv(len(payload) - len(got))
                assert chunk, "the relay closed the connection mid-reply"
                got += chunk
            replies.append(got)
    return replies


def test_every_byte_crosses_intact_each_turn_counts_once_and_the_links_delay_is_paid():
    server, port = _echo_server()
    delay = Direction(delay_s=0.02)
    with server, LinkRelay(("127.0.0.1", port), up=delay, down=delay) as relay:
        payload = bytes(range(256)) * 40  # 10,240 bytes: several reads on the way
        start = time.monotonic()
        replies = _ping(relay.port, payload, 10)
        elapsed = time.monotonic() - start
        time.sleep(0.1)  # the close travels the link too
        counts = relay.counts()
    assert replies == [payload] * 10
    assert counts.up_bytes == counts.down_bytes == 10 * len(payload)
    assert counts.round_trips == 10 and counts.connections == 1 and counts.refused == 0
    assert elapsed >= 10 * 2 * 0.02  # a lower bound from the link, whatever this machine's speed


def test_new_conditions_reach_a_connection_already_open():
    """A sweep moves a long-lived peer from lan to a 40 ms network without reconnecting it."""
    server, port = _echo_server()
    with server, LinkRelay(("127.0.0.1", port)) as relay, \
            socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        def turn() -> float:
            start = time.monotonic()
            s.sendall(b"ping")
            assert s.recv(16) == b"ping"
            return time.monotonic() - start
        turn()
        relay.shape(Direction(delay_s=0.02), Direction(delay_s=0.02))
        shaped = turn()
        relay.shape(None, None)
        turn()
    assert shaped >= 0.04  # both directions' delay, on the connection opened before


def test_round_trips_are_counted_per_connection_when_two_interleave():
    """Two clients whose requests alternate: each turn of each connection is one round trip, not
    every change of direction across them."""
    server, port = _echo_server()
    # The up link's delay orders the events: both requests are read before either reply.
    with server, LinkRelay(("127.0.0.1", port), up=Direction(delay_s=0.02)) as relay:
        a, b = (socket.create_connection(("127.0.0.1", relay.port), timeout=30) for _ in range(2))
        with a, b:
            a.sendall(b"a1")
            b.sendall(b"b1")   # up on b before a's reply: a global count would miss a turn
            assert a.recv(8) == b"a1" and b.recv(8) == b"b1"
            a.sendall(b"a2")
            assert a.recv(8) == b"a2"
        time.sleep(0.05)
        counts = relay.counts()
    assert counts.round_trips == 3 and counts.connections == 2


def test_a_rate_limited_direction_takes_at_least_its_serialisation_time():
    server, port = _echo_server()
    with server, LinkRelay(("127.0.0.1", port), up=Direction(rate_bps=4e6)) as relay:
        start = time.monotonic()
        (reply,) = _ping(relay.port, b"x" * 200_000, 1)
        elapsed = time.monotonic() - start
    assert reply == b"x" * 200_000
    assert elapsed >= 200_000 * 8 / 4e6  # 0.4 s at 4 Mbit/s


def test_a_dead_peer_closes_the_client_and_the_relay_serves_the_next_once_the_peer_is_up():
    port = free_port()
    with LinkRelay(("127.0.0.1", port)) as relay:
        relay_port = relay.port
        with socket.create_connection(("127.0.0.1", relay_port), timeout=10) as s:
            assert s.recv(1) == b""  # closed at once: nothing listens behind the relay
        assert relay.counts().refused == 1
        server, _ = _echo_server(port)
        with server:
            assert _ping(relay_port, b"hello", 2) == [b"hello"] * 2
        assert relay.counts().connections == 1 and relay.counts().round_trips == 2


def test_the_relay_command_forwards_counts_and_writes_its_counts_at_sigterm(tmp_path):
    server, port = _echo_server()
    listen = free_port()
    out = tmp_path / "counts.json"
    proc = subprocess.Popen([PYTHON, "-m", "paretopipe", "netem", "relay", "--to", f"127.0.0.1:{port}", "--port",
                             str(listen), "--delay", "5ms", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    STARTED.append(proc)
    wait_for_line(proc, "relaying", 60)
    with server:
        assert _ping(listen, b"abc" * 100, 3) == [b"abc" * 100] * 3
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    counts = json.loads(out.read_text())
    assert counts["up_bytes"] == counts["down_bytes"] == 900 and counts["round_trips"] == 3
    assert "round_trips 3" in stdout and "delay 5" in counts["conditions"]


@pytest.mark.parametrize("to", ["localhost:8080", "127.0.0.1:0", "127.0.0.1"])
def test_a_bad_peer_address_is_one_line_and_exit_2(to):
    proc = subprocess.run([PYTHON, "-m", "paretopipe", "netem", "relay", "--to", to, "--port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--to" in proc.stderr
