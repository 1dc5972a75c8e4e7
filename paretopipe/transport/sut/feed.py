"""LoadGen's queries as the pipeline's batches, and each batch's result as LoadGen's response.

LoadGen calls :meth:`QueryFeed.issue` on its own thread; the data source's open-ended schedule
takes the batches in order (:meth:`QueryFeed.more`, then :meth:`QueryFeed.load`) and the source's
bookkeeping hands every completed batch back (:meth:`QueryFeed.complete`, from whichever thread
took its result off the link), which tells LoadGen its samples are done. A SingleStream or Server
query is one batch of one sample, a MultiStream query one batch of its samples, and Offline's one
query of every sample is cut into batches of the run's batch size.

When the pipeline fails, :meth:`QueryFeed.abandon` answers every outstanding sample and every
later one at once, so that LoadGen's test returns instead of waiting forever; the run is then
recorded as incomplete, and LoadGen's figures of it are not used.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..inputs import SampleSet

log = logging.getLogger("paretopipe.loadgen")


@dataclasses.dataclass(frozen=True)
class Query:
    """One batch of the pipeline: LoadGen's response ids (none for a warm-up batch) and the
    sample library's indices of its images."""

    ids: tuple[int, ...]
    indices: tuple[int, ...]


class QueryFeed:
    """The queue between LoadGen and the data source, and the responses back."""

    def __init__(self, samples: SampleSet, batch_size: int, query_size: int | None, keep_predictions: bool) -> None:
        self.samples = samples
        self.batch_size = batch_size
        self.query_size = query_size  # None: Offline, cut into batches of batch_size
        self.keep_predictions = keep_predictions
        self.predictions: dict[int, int] = {}
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._loaded: dict[int, torch.Tensor] = {}
        self._in_flight: dict[int, Query] = {}
        self._current: Query | None = None
        self.dead = False
        self.answered = 0

    def __len__(self) -> int:
        return len(self.samples)

    # -- LoadGen's side -------------------------------------------------------------------------
    def issue(self, samples: Sequence[Any]) -> None:
        """LoadGen's IssueQuery: the query's samples, in batches, at the end of the queue."""
        ids = [s.id for s in samples]
        indices = [s.index for s in samples]
        if self.dead:
            self._respond(ids, None)
            return
        size = self.batch_size if self.query_size is None else max(self.query_size, len(ids))
        for i in range(0, len(ids), size):
            self._queue.put(Query(tuple(ids[i:i + size]), tuple(indices[i:i + size])))

    def flush(self) -> None:
        """LoadGen's FlushQueries: every batch is sent as soon as it is issued, so nothing waits."""

    def load_samples(self, indices: Sequence[int]) -> None:
        """LoadGen's LoadSamplesToRam: the images, decoded and transformed, held in memory."""
        for i in indices:
            if i not in self._loaded:
                self._loaded[i] = self.samples.image(i)

    def unload_samples(self, indices: Sequence[int]) -> None:
        for i in indices:
            self._loaded.pop(i, None)

    # -- the harness's side ---------------------------------------------------------------------
    def warm_up(self, batches: int) -> int:
        """``batches`` warm-up batches of the scenario's size, before LoadGen starts; returns how many."""
        size = self.batch_size if self.query_size is None else self.query_size
        for b in range(batches):
            self._queue.put(Query((), tuple((b * size + j) % len(self.samples) for j in range(size))))
        return batches

    def expected(self, records: list[dict[str, Any]], in_flight: int, scenario: str) -> tuple[float, float]:
        """(a sample's expected latency, the expected rate) from the warm-up batches."""
        done = [b for b in records if b.get("latency_s") is not None]
        # Queries are generated for the minimum duration at the expected latency: a low guess
        # only generates more than are issued (a test ends once its minimums are met).
        fastest = min(b["latency_s"] for b in done) if done else 0.02
        size = self.batch_size if self.query_size is None else self.query_size
        rate = in_flight * size / fastest if fastest > 0 else 100.0
        if len(done) >= 2:
            span = max(b["end_s"] for b in done) - min(b["start_s"] for b in done)
            rate = sum(b.get("images", size) for b in done) / span if span > 0 else rate
        return fastest / 2 / max(1, size if scenario == "multistream" else 1), rate

    @staticmethod
    def server_bounds(opts: Any) -> tuple[float, None]:
        """A Server step's bound: each query's latency."""
        return opts.latency_bound_s, None

    def end(self) -> None:
        """No more batches: the source's schedule ends after the ones already queued."""
        self._queue.put(None)

    # -- the data source's side -----------------------------------------------------------------
    def more(self, check: Callable[[], None] = lambda: None) -> bool:
        """Wait for the next batch (True), or the end (False), calling ``check`` while waiting (it
        raises when the pipeline has failed: LoadGen waits for a result before it issues more)."""
        while True:
            try:
                item = self._queue.get(timeout=0.05)
                break
            except queue.Empty:
                check()
        if item is None:
            return False
        self._current = item
        return True

    def load(self, seq: int) -> torch.Tensor:
        """The batch :meth:`more` found, as batch ``seq``: its images stacked."""
        q = self._current
        with self._lock:
            self._in_flight[seq] = q
        images = [self._loaded.get(i) for i in q.indices]
        return torch.stack([img if img is not None else self.samples.image(i) for img, i in zip(images, q.indices)])

    def complete(self, seq: int, output: Any = None) -> None:
        """Batch ``seq`` is done (its result decoded at the source): LoadGen's samples with it."""
        with self._lock:
            q = self._in_flight.pop(seq, None)
        if q is None or not q.ids:
            return
        self._respond(list(q.ids), self._top1(q, output))

    def _top1(self, q: Query, output: Any) -> np.ndarray | None:
        """A classifier's top-1 class per sample (the accuracy log's data), kept for accuracy."""
        if not self.keep_predictions or not isinstance(output, torch.Tensor) or output.dim() != 2:
            return None
        top = output.argmax(dim=1).to(torch.int32).cpu().numpy()
        for i, p in zip(q.indices, top):
            self.predictions[int(i)] = int(p)
        return top

    def _respond(self, ids: list[int], top1: np.ndarray | None) -> None:
        # lazy for start-up: mlperf_loadgen
        import mlperf_loadgen as lg

        if top1 is not None:
            data = np.ascontiguousarray(top1, dtype=np.int32)
            base = data.ctypes.data
            responses = [lg.QuerySampleResponse(i, base + 4 * j, 4) for j, i in enumerate(ids)]
        else:
            responses = [lg.QuerySampleResponse(i, 0, 0) for i in ids]
        lg.QuerySamplesComplete(responses)  # LoadGen copies the data before it returns
        self.answered += len(ids)

    def abandon(self) -> None:
        """The pipeline is gone: answer every sample in flight, queued, or issued from now on."""
        self.dead = True
        with self._lock:
            stranded = list(self._in_flight.values())
            self._in_flight.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                stranded.append(item)
        ids = [i for q in stranded for i in q.ids]
        if ids:
            log.warning("loadgen: the pipeline failed; %d samples answered empty so that LoadGen ends", len(ids))
            self._respond(ids, None)
        self._queue.put(None)
