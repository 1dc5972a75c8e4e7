"""The data source's endpoint, shared by both backends: it loads the inputs, keeps the window and
stamps each batch on its own clock; a backend adds how its first part is computed and sent."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from . import inputs, pipeline
from .runconfig import RunConfig
from .bookkeeping import BatchBook


class SourceEndpoint:
    """The ``load``, ``admit`` and ``drain`` of :func:`pipeline.source_actions`; subclasses define
    ``compute`` and ``send``, and ``check`` (raises when a peer or a sender failed)."""

    def __init__(self, cfg: RunConfig, input_size: int, book: BatchBook, drain_limit_s: float) -> None:
        self.cfg, self.book, self.drain_limit_s = cfg, book, drain_limit_s
        self.input_size = input_size
        self._batches: Iterator[torch.Tensor] | None = None
        self.x: torch.Tensor | None = None  # the batch between load and send
        self.rec: dict[str, Any] = {}  # its record, filled as it goes

    def check(self) -> None:
        """Raise the run's failure, if any (a dead peer, a failed sender)."""

    def start_fields(self, x: torch.Tensor) -> dict[str, Any]:
        """Fields the batch's record starts with."""
        return {}

    def actions(self) -> list[pipeline.Action]:
        """The schedule this endpoint runs (a backend may settle each batch before the next)."""
        return pipeline.source_actions(self.book.total)

    def load(self, seq: int) -> None:
        self.x = next(self._batches)

    def admit(self, seq: int) -> None:
        self.book.acquire(self.check)
        self.rec = self.book.start(seq, **self.start_fields(self.x))

    def drain(self, _: None) -> None:
        self.book.wait_finished(self.check, self.drain_limit_s)

    def run(self) -> None:
        """Drive the whole schedule; the inputs' prefetch thread is closed however it ends. The
        inputs open here, on the thread that runs the schedule (a prefetch thread it starts shares
        that thread's CPU share)."""
        cfg = self.cfg
        self._batches = inputs.source_batches(cfg.dataset, cfg.batch_size, self.input_size, self.book.total,
                                              cfg.data_dir, cfg.seed, cfg.prefetch_batches)
        try:
            pipeline.drive(self.actions(), self)
        finally:
            if isinstance(self._batches, inputs.Prefetcher):
                self._batches.close()
