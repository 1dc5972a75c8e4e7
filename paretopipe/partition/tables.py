"""A zoo model's cut tables: build it (on the meta device for structure only), trace it, and
tabulate its block and fine cuts for ``split --list``, the sweep's planning and the structure cache.

Above :mod:`.fxcuts` and :mod:`.models`, which it joins; :mod:`.structure` computes its cached
documents here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import models
from .fxcuts import INPUT, OUTPUT, Partitioner
from .names import DEFAULT_NUM_CLASSES


def partitioner_for(name: str, batch: int = 1, num_classes: int = DEFAULT_NUM_CLASSES, weights: str | None = None,
                    structure_only: bool = False) -> tuple[nn.Module, Partitioner]:
    """Build ``name`` from the zoo and trace it at ``batch`` images.

    ``structure_only`` builds the model on the meta device (no weights, no memory, no compute):
    cut points, shapes, bytes and FLOPs are the same, so ``--list`` and ``--dry-run`` take a
    fraction of a second. Its stages cannot run."""
    canonical = models.canonical_name(name)
    size = models.input_size(name)
    if structure_only:
        model = models.skeleton(canonical, num_classes).eval()
        device = next(iter(model.parameters()), torch.empty(0, device="meta")).device
        return model, Partitioner(model, torch.zeros(batch, 3, size, size, device=device), canonical)
    model = models.build(name, num_classes=num_classes, weights=weights)
    return model, Partitioner(model, torch.zeros(batch, 3, size, size), canonical)


def fine_cut_table(part: Partitioner) -> dict[str, list[int]]:
    """Every fine cut in graph order: ``name -> [tensors that cross it, bytes per image]`` (what a
    sweep needs of the cuts ``--max-live`` and ``--splits NAME`` add, without torch)."""
    return {c.name: [c.width, c.nbytes // part.batch] for c in part.fine_cuts}


def cut_rows(part: Partitioner, max_live: int = 3) -> list[dict[str, Any]]:
    """Every cut of up to ``max_live`` tensors: its width, the bytes that cross it per image, the
    share of the model's FLOPs before it (stage 1's compute), and whether it is a multi-tensor cut
    that sends less than both single-tensor cuts around it in graph order (the nearest before and
    after; a cut near either end has only one)."""
    cuts = part.candidate_cuts(max_live)
    singles = [c for c in cuts if c.width == 1]
    total = max(part.total_flops, 1)
    rows = []
    for c in cuts:
        before = [s.nbytes for s in singles if s.position < c.position][-1:]
        after = [s.nbytes for s in singles if s.position > c.position][:1]
        neighbours = before + after
        rows.append({"cut": c.name, "width": c.width, "bytes_per_image": c.nbytes // part.batch,
                     "flops_before_pct": 100 * c.flops_before / total,
                     "less_than_neighbours": c.width > 1 and bool(neighbours) and c.nbytes < min(neighbours)})
    return rows


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_table(part: Partitioner, fine: bool = False) -> str:
    """The table printed by ``--list``: one row per block split (or per fx cut with ``fine``)."""
    total = max(part.total_flops, 1)
    rows = []
    if fine:
        header = ("index", "cut", "live", "shapes", "bytes@1", "FLOPs %")
        for c in part.fine_cuts:
            shapes = " + ".join("x".join(map(str, t.shape[1:])) or "scalar" for t in c.live)
            rows.append((str(c.index), c.name, str(c.width), shapes,
                         _human_bytes(c.nbytes // part.batch), f"{100 * c.flops_before / total:.1f}"))
    else:
        header = ("k", "block", "cut", "shape", "bytes@1", "FLOPs %")
        rows.append(("0", "(input)", INPUT, "-", _human_bytes(part.payload_nbytes(INPUT, 1)), "0.0"))
        for b in part.blocks:
            c = b.cut
            rows.append((str(b.k), b.module, c.name, "x".join(map(str, c.shape[1:])),
                         _human_bytes(c.nbytes // part.batch), f"{100 * c.flops_before / total:.1f}"))
        rows.append((str(part.num_blocks), "(whole model)", OUTPUT, "-",
                     _human_bytes(part.payload_nbytes(OUTPUT, 1)), "100.0"))
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
