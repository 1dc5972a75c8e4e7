"""Deadlines that follow the link: how long a run may wait for progress, from what it sends and the
network conditions it runs under.

A fixed timeout is a claim about the link that slow links break: at batch 8, MobileNetV2's k=2
sends 6.4 MB a batch, which 3G's 768 kbit/s uplink carries in 67 s, past the 60 s every run used
to allow. So a run's deadline is the fixed base (start-up hiccups, a scheduler's pause) plus a
margin times what the batches in flight need: every byte serialised at the slowest rate the link
offers (a trace's slowest stretch, exactly), the delay with four jitters, a resend per expected lost
segment, and the compute measured so far. A stage 100 times slower than native (an aarch64 stage
under qemu) only lengthens the measured compute; nothing is special-cased.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import traces
from .conditions import Direction, NetworkConditions

#: What a fixed timeout covered: waits that have nothing to do with the bytes sent.
BASE_S = 60.0
#: The estimate is a bound on a link that behaves as configured; the margin covers TCP's slow start,
#: retransmission timeouts and a stage that computes slower than it did before.
MARGIN = 3.0


@functools.lru_cache(maxsize=256)
def _trace_worst_s(source: str, packets: int) -> float:
    """The longest a trace takes to offer ``packets`` delivery opportunities, over every start."""
    trace = traces.load(source)
    opps = np.asarray(trace.opportunities_ms, dtype=np.float64) / 1e3
    n = len(opps)
    ends = np.arange(n) + packets
    end_s = (ends // n) * trace.period_s + opps[ends % n]
    return float(np.max(end_s - opps))


def serialise_bound_s(direction: Direction, nbytes: int) -> float:
    """Time to push ``nbytes`` through ``direction`` at its slowest: a constant rate, or the
    slowest stretch of its trace of that many bytes (an outage included)."""
    if nbytes <= 0:
        return 0.0
    if direction.trace:
        return _trace_worst_s(direction.trace, max(1, math.ceil(nbytes / traces.PACKET_BYTES)))
    return direction.serialise_s(nbytes)


def transfer_bound_s(direction: Direction, nbytes: int) -> float:
    """One frame of ``nbytes`` across ``direction``: serialisation, delay plus four jitters, and one
    round trip per expected lost segment (plus one)."""
    resends = direction.expected_lost_segments(nbytes) + (1 if direction.loss_percent else 0)
    return (serialise_bound_s(direction, nbytes) + direction.delay_s + 4 * direction.jitter_s
            + resends * 2 * (direction.delay_s + 4 * direction.jitter_s))


def run_timeout_s(conditions: NetworkConditions | None, bytes_up: int, bytes_down: int, in_flight: int = 1,
                  compute_s: float = 0.0, base_s: float = BASE_S) -> float:
    """Seconds a stage may wait for the next frame of a run.

    ``bytes_up``/``bytes_down``: one batch's payload each way (at the batch size and the wire
    dtype); ``compute_s``: one batch's compute over all stages, as measured so far (0 before any).
    Every batch in flight may be queued ahead of the one awaited, so the bound scales with them.
    """
    per_batch = max(0.0, compute_s)
    if conditions is not None:
        per_batch += transfer_bound_s(conditions.up, bytes_up) + transfer_bound_s(conditions.down, bytes_down)
    return base_s + MARGIN * max(1, in_flight) * per_batch
