"""What crosses a cut: one tensor, or the live set of a cut where several cross, and the few
things every layer does with it (count its bytes, move it to the host, call a stage on it).

A leaf of the partition layer: detectors, stages, the wire and both backends use it without the
graph machinery of :mod:`.fxcuts`.
"""

from __future__ import annotations

import torch
from torch import nn

#: What crosses a cut: one tensor, or the live set of a cut where several cross (a tuple in graph order).
Activation = torch.Tensor | tuple[torch.Tensor, ...]


def live_tensors(x: Activation) -> tuple[torch.Tensor, ...]:
    """What crossed a cut as a tuple, whether one tensor or a live set of several."""
    return x if isinstance(x, tuple) else (x,)


def activation_nbytes(x: Activation) -> int:
    """The bytes of what crossed a cut, summed over a live set."""
    return sum(t.numel() * t.element_size() for t in live_tensors(x))


def to_host(x: Activation) -> Activation:
    """What a stage computed, detached, on the CPU and contiguous, ready to send: one tensor or a live set."""
    moved = tuple(t.detach().cpu().contiguous() for t in live_tensors(x))
    return moved if isinstance(x, tuple) else moved[0]


def call_stage(stage: nn.Module, x: Activation) -> Activation:
    """Run a stage on what crossed its incoming cut: one tensor, or a live set as its arguments."""
    return stage(*x) if isinstance(x, tuple) else stage(x)
