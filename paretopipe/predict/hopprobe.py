"""The fixed cost of one frame hop between two stage processes on this host, through the same
threads, queues and framing as the TCP backend (sender thread, receiving thread, compute thread).

A tiny frame goes from this process to an echo process and back; half the median round trip is
what every hop between co-located stages costs on top of its bytes. A single-process round trip
misses most of it: the cross-process wake-ups are the expensive part.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import statistics
import threading
import time

import torch

from ..network.emulated import LinkSender
from ..transport import wire


def _echo(port_box: "mp.Queue", cpus: set[int] | None) -> None:
    """Stage-2 shape: receive on the main thread, hand to a worker thread, send from a sender thread."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(1)
    listener = socket.create_server(("127.0.0.1", 0))
    port_box.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    work: queue.Queue = queue.Queue()
    sender = LinkSender(None, "echo-send")

    def worker() -> None:
        while (f := work.get()) is not None:
            enc = wire.encode(wire.RESULT, f.seq, f.tensor)
            sender.submit(enc.total_nbytes, lambda e=enc: wire.send_encoded(conn, e))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        while True:
            f = wire.recv_frame(conn)
            if f.kind == wire.BYE:
                break
            work.put(f)
    finally:
        work.put(None)
        thread.join(5)
        sender.close()
        conn.close()


def hop_fixed_s(reps: int = 60, warmup: int = 10, start_method: str = "fork") -> float:
    """Half the median round trip of a 10-float frame through two processes' backend threads;
    ``start_method``: how the echo process starts (``benchmarks/hop_probe.py`` compares them)."""
    mine = os.sched_getaffinity(0)
    others = set(range(os.cpu_count() or 1)) - mine
    # Forked, not spawned: a spawned echo imports torch again, about 3 s of CPU and of wall time a
    # profile, 30 times a forked one's CPU for the same round trip (benchmarks/hop_probe.py). The
    # profile calls this before its own threads, its CPU share and any engine's session exist, and
    # the echo runs torch on one thread: the fork inherits no pool to deadlock on.
    ctx = mp.get_context(start_method)
    port_box = ctx.Queue()
    child = ctx.Process(target=_echo, args=(port_box, others or None), daemon=True)
    child.start()
    try:
        port = port_box.get(timeout=60)
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sender = LinkSender(None, "probe-send")
        arrived: queue.Queue = queue.Queue()

        def receive() -> None:
            for _ in range(reps + warmup):
                wire.recv_frame(sock)
                arrived.put(time.perf_counter())

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        x = torch.zeros(1, 10)
        rtts = []
        for seq in range(reps + warmup):
            t0 = time.perf_counter()
            enc = wire.encode(wire.TENSOR, seq, x)
            sender.submit(enc.total_nbytes, lambda e=enc: wire.send_encoded(sock, e))
            rtts.append(arrived.get(timeout=30) - t0)
            time.sleep(0.002)  # like a pipeline, not a tight ping-pong loop that keeps every thread hot
        wire.send_frame(sock, wire.BYE)
        sender.close()
        sock.close()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return statistics.median(rtts[warmup:]) / 2
