"""The data source's endpoint, shared by both backends: it loads the inputs, keeps the window and
stamps each batch on its own clock; a backend adds how its first part is computed and sent.

The inputs are a workload's: image batches (a dataset, or LoadGen's queries) in
:class:`SourceEndpoint`, or a language model's prompts and the tokens fed back in
:class:`PromptSource`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import torch

from ..llm.summary import finish_record
from . import inputs, pipeline
from .runconfig import RunConfig
from .bookkeeping import BatchBook

if TYPE_CHECKING:
    from .sut.harness import Harness


class SourceEndpoint:
    """The ``load``, ``admit`` and ``drain`` of :func:`pipeline.source_actions` for image batches
    (a dataset's, or LoadGen's queries); subclasses define ``compute`` and ``send``, and ``check``
    (raises when a peer or a sender failed). :class:`PromptSource` is a generation's variant."""

    def __init__(self, cfg: RunConfig, builder: Any, book: BatchBook, drain_limit_s: float) -> None:
        self.cfg, self.book, self.drain_limit_s = cfg, book, drain_limit_s
        self.builder = builder
        self.input_size = builder.input_size
        self._batches: Iterator[torch.Tensor] | None = None
        self.x: torch.Tensor | None = None  # the batch between load and send
        self.rec: dict[str, Any] = {}  # its record, filled as it goes
        #: Inputs beyond the planned batches a run may load (a fault run goes on until it recovers).
        self.spare_batches = 0
        # A LoadGen scenario: the batches are LoadGen's queries, as many as it issues.
        self.harness: Harness | None = None
        if cfg.loadgen is not None:
            # lazy for start-up: mlperf_loadgen (only a scenario's run loads LoadGen)
            from .sut.harness import Harness

            self.harness = Harness(cfg, builder, book)
            self._take_queries(self.harness)

    def _take_queries(self, harness: Harness) -> None:
        """LoadGen's image queries: each is answered as its batch's result lands."""
        self.book.on_complete = harness.feed.complete

    def check(self) -> None:
        """Raise the run's failure, if any (a dead peer, a failed sender)."""

    def start_fields(self, x: torch.Tensor) -> dict[str, Any]:
        """Fields the batch's record starts with."""
        return {}

    def actions(self) -> Iterable[pipeline.Action]:
        """The schedule this endpoint runs (a backend may settle each batch before the next)."""
        if self.harness is not None:
            return pipeline.open_source_actions(lambda: self.harness.feed.more(self._check_waiting))
        return pipeline.source_actions(self.book.total)

    def load(self, seq: int) -> None:
        if self.harness is not None:
            self.x = self.harness.feed.load(seq)
            return
        self.x = next(self._batches)

    def _check_waiting(self) -> None:
        """While LoadGen's next query is awaited: a failed peer, a batch past --max-batch-s, or a
        result that has not come for the run's timeout ends the run (LoadGen issues a
        SingleStream query only once the last is answered, so nothing else would)."""
        self.check()
        self.book.check_deadline()
        self.book.check_stalled()

    def loadgen_fields(self) -> dict[str, Any]:
        """A LoadGen batch's size, which varies (a record's batches are otherwise all one size)."""
        return {"images": int(self.x.shape[0])} if self.harness is not None else {}

    def workload_fields(self, seq: int) -> dict[str, Any]:
        """What a batch's record says of it beyond the window (a LoadGen query's size)."""
        return self.loadgen_fields()

    def result_fields(self, seq: int, meta: Any) -> dict[str, Any]:
        """What a result adds to its batch's record beyond its times and bytes (a generation: the
        step's token)."""
        return {}

    def result_landed(self, seq: int, fields: dict[str, Any]) -> None:
        """After a batch's record is complete (a generation feeds its token on)."""

    def finish_record(self, record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> None:
        """The record's workload figures once it is built, on either backend (a generation's token
        figures; image batches add none)."""

    def admit(self, seq: int) -> None:
        self.book.acquire(self.check)
        self.rec = self.book.start(seq, **self.start_fields(self.x), **self.workload_fields(seq))

    def drain(self, _: None) -> None:
        if self.harness is not None:
            self.book.close_at(len(self.book.batches))
        self.book.wait_finished(self.check, self.drain_limit_s)

    def run(self) -> None:
        """Drive the whole schedule; the inputs' prefetch thread is closed however it ends. The
        inputs open here, on the thread that runs the schedule (a prefetch thread it starts shares
        that thread's CPU share)."""
        cfg = self.cfg
        if self.harness is not None:
            self._run_loadgen()
            return
        self._batches = inputs.source_batches(cfg.dataset, cfg.batch_size, self.input_size,
                                              self.book.total + self.spare_batches,
                                              cfg.data_dir, cfg.seed, cfg.prefetch_batches, cfg.model)
        try:
            pipeline.drive(self.actions(), self)
        finally:
            if isinstance(self._batches, inputs.Prefetcher):
                self._batches.close()

    def _run_loadgen(self) -> None:
        """The schedule LoadGen's queries make, LoadGen's thread beside it; a pipeline that fails
        answers LoadGen's outstanding samples, so that its thread ends too."""
        failed = True
        self.harness.start()
        try:
            pipeline.drive(self.actions(), self)
            failed = False
        finally:
            self.harness.stop(failed)
        self.harness.check()


class PromptSource(SourceEndpoint):
    """A generation's source: its batches are prompts and the tokens fed back
    (:class:`~paretopipe.transport.generation.PromptFeed`, or LoadGen's token queries), each step
    waiting for the token it feeds on. A backend's generation endpoint puts this after its own
    class (``class X(BackendSource, PromptSource)``), so that the backend's methods call these."""

    def __init__(self, cfg: RunConfig, builder: Any, book: BatchBook, drain_limit_s: float) -> None:
        super().__init__(cfg, builder, book, drain_limit_s)
        # lazy for start-up: transformers (a language model's run only)
        from .generation import PromptFeed

        # LoadGen's queries are prompts too, answered as their tokens land.
        self.feed: PromptFeed = self.harness.feed if self.harness is not None else PromptFeed(builder, cfg)
        self.step: tuple[int, int] = (0, 0)  # (stream, start) between load and send

    def _take_queries(self, harness: Harness) -> None:
        """LoadGen's token queries are this source's feed (answered token by token, not per batch)."""

    def actions(self) -> Iterable[pipeline.Action]:
        return self.feed.actions(self._check_waiting)

    def feedback(self, seq: int) -> None:
        """A step waits for the token it feeds on (a dead peer or a stalled run ends it)."""
        self.feed.wait_for(seq, self._check_waiting, self.cfg.timeout_s)

    def load(self, seq: int) -> None:
        stream, start, self.x = self.feed.load(seq)
        self.step = (stream, start)

    def workload_fields(self, seq: int) -> dict[str, Any]:
        """A step's stream, step and position."""
        return self.feed.fields(seq, self.step[1])

    def result_fields(self, seq: int, meta: Any) -> dict[str, Any]:
        return {"token": self.feed.token_of(seq, meta)}

    def result_landed(self, seq: int, fields: dict[str, Any]) -> None:
        self.feed.landed(seq, fields["token"])

    def finish_record(self, record: dict[str, Any], parts: Sequence[dict[str, Any] | None]) -> None:
        finish_record(record, parts)

    def run(self) -> None:
        if self.harness is not None:
            self._run_loadgen()
            return
        pipeline.drive(self.actions(), self)
