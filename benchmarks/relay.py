#!/usr/bin/env python3
"""The relay's own cost: what ``paretopipe netem relay`` adds to a round trip on an unshaped link.

A client and an echo server on loopback (the server in its own process, as a foreign peer is)
exchange request-reply turns of a small frame (a hidden state's 2.3 KB) and of a large one (a
49,152-entry float32 logits vector, 192 KB), directly and through an unshaped
:class:`paretopipe.network.relay.LinkRelay` in this process. The two paths alternate within each
of several rounds (their order flips every round: this VM's speed swings), and the figure is the
median over rounds of (through the relay - direct) per turn: the time the relay adds, which a
sweep's prediction of a foreign engine's time per token subtracts or reports beside its error.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import time

from paretopipe.network.relay import LinkRelay

SIZES = {"hidden state 2.3 KB": 2304, "logits 192 KB": 49152 * 4}


def _echo(port_queue: "multiprocessing.Queue[int]") -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port_queue.put(server.getsockname()[1])
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)


def _turns(port: int, size: int, turns: int) -> float:
    """Seconds per request-reply turn of ``size`` bytes each way through 127.0.0.1:``port``."""
    payload, buf = b"\x01" * size, bytearray(size)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        for _ in range(turns):
            s.sendall(payload)
            view, got = memoryview(buf), 0
            while got < size:
                got += s.recv_into(view[got:])
        return (time.perf_counter() - start) / turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--turns", type=int, default=1000)
    args = p.parse_args()
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=_echo, args=(ports,), daemon=True)
    server.start()
    port = ports.get(timeout=30)
    with LinkRelay(("127.0.0.1", port)) as relay:
        relayed = relay.port
        print(f"{'frame':<22} {'direct':>10} {'relayed':>10} {'added per turn':>15}")
        for name, size in SIZES.items():
            added, direct_s, relay_s = [], [], []
            for r in range(args.rounds):
                order = (port, relayed) if r % 2 == 0 else (relayed, port)
                times = {p_: _turns(p_, size, args.turns) for p_ in order}
                direct_s.append(times[port])
                relay_s.append(times[relayed])
                added.append(times[relayed] - times[port])
            print(f"{name:<22} {statistics.median(direct_s) * 1e6:8.0f} us {statistics.median(relay_s) * 1e6:8.0f} us "
                  f"{statistics.median(added) * 1e6:12.0f} us")
    server.terminate()


if __name__ == "__main__":
    main()
