"""The Server rate a split should sustain, predicted from its service times.

Every query passes each resource of the pipeline (stage compute, each link's serialisation) once;
the slowest, the bottleneck with service time ``s``, sets the capacity ``1 / s``. Below it,
Poisson arrivals queue at the bottleneck: Kingman's heavy-traffic approximation gives the waiting
time's tail P(W > t) ~ rho exp(-2 (1 - rho) t / (s (ca2 + cs2))), with ca2 = 1 for Poisson
arrivals and cs2 = 0 for a deterministic service. A query's 99th percentile is then the
pipeline's unloaded latency plus the wait's 99th percentile, and the predicted rate is the
highest at which that stays within the bound (found by bisection: the tail grows with the rate).
"""

from __future__ import annotations

import math
from typing import Any

PERCENTILE = 0.99


def wait_quantile_s(rate: float, service_s: float, q: float = PERCENTILE, cs2: float = 0.0) -> float:
    """The ``q`` quantile of the wait at a single server of deterministic ``service_s`` under
    Poisson arrivals at ``rate`` (infinite at or above capacity)."""
    rho = rate * service_s
    if rho >= 1:
        return math.inf
    tail = 1 - q
    if rho <= tail:  # the chance of waiting at all is below the tail
        return 0.0
    return service_s * (1 + cs2) / (2 * (1 - rho)) * math.log(rho / tail)


def server_bound(service_s: float, latency_s: float, bound_s: float, q: float = PERCENTILE) -> dict[str, Any]:
    """The capacity ``1 / service_s``, and the highest rate whose predicted ``q`` quantile of
    ``latency_s`` plus the wait stays within ``bound_s`` (0 when even an idle pipeline misses it)."""
    capacity = 1.0 / service_s
    if latency_s > bound_s:
        return {"capacity_qps": capacity, "predicted_qps": 0.0}
    lo, hi = 0.0, capacity
    for _ in range(60):
        mid = (lo + hi) / 2
        if latency_s + wait_quantile_s(mid, service_s, q) <= bound_s:
            lo = mid
        else:
            hi = mid
    return {"capacity_qps": capacity, "predicted_qps": lo}


def predicted_columns(terms: Any, bound_s: float) -> dict[str, Any]:
    """A split's predicted Server columns from its cost-model terms (a batch of one sample)."""
    name, busy = terms.bottleneck()
    b = server_bound(busy / terms.batch_size, terms.latency_s(), bound_s)
    return {"predicted_server_capacity_qps": b["capacity_qps"], "predicted_server_qps": b["predicted_qps"],
            "predicted_server_bottleneck": name, "latency_bound_s": bound_s}
