"""LoadGen's queries as a language model's generations: each query one prompt, answered token by token.

A query takes one of the run's ``--streams`` slots (a KV cache at every stage) for its whole
generation: its prefill, then a decode step per token, each fed the token the last one came back
with (the schedule's feedback edge). The data source's open-ended schedule takes whichever step is
ready next (:meth:`TokenFeed.next_step`): a decode step whose token has landed, or the prefill of
a query waiting for a slot, in the order they became ready. LoadGen hears of the first token as it
lands (``FirstTokenComplete``) and of the query when its last token does (``QuerySamplesComplete``
with the number of tokens), so it times the first token and each one after it on its own clock.

The prompts are the sample library: ``--sample-count`` seeded prompts of ``--prompt-len`` tokens,
the ``--prompt`` text for every sample, or consecutive windows of ``--eval-text``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ...errors import UsageError
from ...llm.prompts import prompt_ids
from .. import pipeline
from ..fidelity import text_ids
from ..generation import PromptFeed
from ..runconfig import RunConfig

log = logging.getLogger("paretopipe.loadgen")


@dataclasses.dataclass
class _Query:
    """One prompt's generation: LoadGen's response id (None for a warm-up query), its sample, the
    slot it holds, the tokens so far, and when its last token landed."""

    number: int
    response_id: int | None
    sample: int
    slot: int | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    done_s: float | None = None


def library_prompts(builder: Any, cfg: RunConfig, count: int) -> list[list[int]]:
    """The sample library's ``count`` prompts as token ids (see the module's docstring)."""
    g, shape = cfg.generation, builder.shape
    if cfg.eval_text is None or g.prompt is not None:
        return [prompt_ids(g.prompt, g.prompt_len, shape.vocab_size, shape.max_position_embeddings, g.gen_tokens,
                           builder.tokenizer, cfg.seed, i, chat=g.chat) for i in range(count)]
    ids = text_ids(builder, cfg.eval_text)
    length = g.prompt_len
    if len(ids) < length:
        raise UsageError(f"--eval-text {cfg.eval_text}: {len(ids)} tokens, fewer than one prompt of --prompt-len "
                         f"{length}")
    windows = len(ids) // length
    return [ids[(i % windows) * length:(i % windows + 1) * length] for i in range(count)]


class TokenFeed(PromptFeed):
    """The queue between LoadGen and a generation's data source, and the tokens back to LoadGen."""

    def __init__(self, builder: Any, cfg: RunConfig) -> None:
        super().__init__(builder, cfg)
        self.library = library_prompts(builder, cfg, cfg.loadgen.sample_count)
        self.steps = []  # grows as queries' steps are scheduled
        self.prompts, self.position = {}, {}
        self.queries: list[_Query] = []
        self._of_seq: list[_Query] = []  # the query of each scheduled step
        self._waiting: collections.deque[_Query] = collections.deque()  # issued, no slot yet
        self._ready: collections.deque[tuple[_Query, int | None]] = collections.deque()  # (query, step it feeds on)
        self._free = list(range(self.g.streams))
        self._cond = threading.Condition()
        self._ended = False
        self.dead = False
        self.answered = 0

    def __len__(self) -> int:
        return len(self.library)

    # -- LoadGen's side -------------------------------------------------------------------------
    def issue(self, samples: Sequence[Any]) -> None:
        """LoadGen's IssueQuery: each sample a query, waiting for a slot."""
        if self.dead:
            self._answer([s.id for s in samples], [[] for _ in samples])
            return
        with self._cond:
            for s in samples:
                self._add(s.id, s.index)
            self._cond.notify_all()

    def flush(self) -> None:
        """LoadGen's FlushQueries: every query is scheduled as soon as a slot is free."""

    def load_samples(self, indices: Sequence[int]) -> None:
        """LoadGen's LoadSamplesToRam: the prompts are token ids, already in memory."""

    def unload_samples(self, indices: Sequence[int]) -> None:
        """LoadGen's UnloadSamplesFromRam: nothing to release."""

    # -- the harness's side ---------------------------------------------------------------------
    def warm_up(self, batches: int) -> int:
        """The warm-up generations that ``batches`` warm-up steps make (whole queries:
        :meth:`RunConfig._derive_generation` counts their steps), before LoadGen starts; returns
        the batches they make."""
        queries = batches // self.g.gen_tokens
        with self._cond:
            for q in range(queries):
                self._add(None, q % len(self.library))
            self._cond.notify_all()
        return queries * self.g.gen_tokens

    def server_bounds(self, opts: Any) -> tuple[float, tuple[float | None, float | None]]:
        """A Server step's bounds: a whole query's, and the time to first token and per token."""
        return opts.query_bound_s(self.g.gen_tokens), (opts.ttft_bound_s, opts.tpot_bound_s)

    def expected(self, steps: Sequence[dict[str, Any]], in_flight: int = 1,
                 scenario: str = "") -> tuple[float, float]:
        """LoadGen's expectations from the warm-up's steps: a query's latency from its fastest
        prefill and decode steps (halved: a low guess only makes LoadGen generate more queries than
        it issues), and the rate of ``--streams`` queries at a time, each of ``--gen-tokens`` steps
        at the median step's latency (the warm-up ran that many queries at once, so its steps
        waited as a loaded run's do; its first steps, cold, are only a few of them).
        ``in_flight`` and ``scenario`` are an image feed's: a generation's window is its streams."""
        latencies = [b["latency_s"] for b in steps if b.get("latency_s") is not None]
        fastest = {first: min((b["latency_s"] for b in steps if (b.get("step") == 0) == first
                               and b.get("latency_s") is not None), default=None) for first in (True, False)}
        prefill = fastest[True] or 0.01
        latency = prefill + (self.g.gen_tokens - 1) * (fastest[False] or prefill)
        per_query = self.g.gen_tokens * float(np.median(latencies)) if latencies else latency
        return latency / 2, self.g.streams / per_query

    def end(self) -> None:
        """No more queries: the schedule ends once the queries in flight have finished."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def abandon(self) -> None:
        """The pipeline is gone: answer every query in flight, waiting, or issued from now on."""
        with self._cond:
            self.dead = True
            stranded = [q for q in self.queries if q.response_id is not None and q.done_s is None]
            for q in stranded:
                q.done_s = time.monotonic()
            self._waiting.clear()
            self._ready.clear()
            self._ended = True
            self._cond.notify_all()
        if stranded:
            log.warning("loadgen: the pipeline failed; %d queries answered empty so that LoadGen ends", len(stranded))
            self._answer([q.response_id for q in stranded], [[] for _ in stranded])

    # -- the data source's side -----------------------------------------------------------------
    def actions(self, check: Callable[[], None] = lambda: None) -> Iterator[pipeline.Action]:
        """The open-ended schedule: each ready step loaded, admitted, computed and sent; ``drain``
        once LoadGen has ended and no query is left in flight."""
        while (seq := self.next_step(check)) is not None:
            yield from (pipeline.Action(op, seq) for op in ("load", "admit", "compute", "send"))
        yield pipeline.Action("drain")

    def next_step(self, check: Callable[[], None]) -> int | None:
        """The next ready step, scheduled as batch ``seq`` (None: the run has ended), calling
        ``check`` while waiting (it raises when the pipeline failed)."""
        while True:
            with self._cond:
                if self._ready:
                    return self._schedule(*self._ready.popleft())
                if self.dead or (self._ended and not self._in_flight()):
                    return None
                self._cond.wait(0.05)
                if self._ready:
                    continue
            check()

    def _schedule(self, query: _Query, feeds_on: int | None) -> int:
        """A ready step of ``query`` as the next batch (the lock held)."""
        seq = len(self.steps)
        self.steps.append(pipeline.GenerationStep(query.slot, len(query.tokens), feeds_on))
        self._of_seq.append(query)
        if feeds_on is None:
            self.prompts[query.slot] = self.library[query.sample]
            self.position[query.slot] = 0
        return seq

    def fields(self, seq: int, start: int) -> dict[str, Any]:
        """A step's record names its query as its stream (a slot serves many queries), and the slot."""
        step = self.steps[seq]
        return {"stream": self._of_seq[seq].number, "slot": step.stream, "step": step.step, "position": start}

    def landed(self, seq: int, token: int) -> None:
        """A step's token is back: LoadGen hears of a first token and of a finished query; the
        query's next step becomes ready, or its slot goes to the next waiting query."""
        query = self._of_seq[seq]
        with self._cond:
            self.tokens[seq] = token
            query.tokens.append(token)
            finished = len(query.tokens) >= self.g.gen_tokens
            if finished:
                query.done_s = time.monotonic()
                self._free.append(query.slot)
                self._assign()
            else:
                self._ready.append((query, seq))
            self._cond.notify_all()
        if query.response_id is None or self.dead:
            return
        if finished:
            self._answer([query.response_id], [query.tokens])
        elif len(query.tokens) == 1:
            self._first_token(query.response_id, token)

    # -- inside ---------------------------------------------------------------------------------
    def _add(self, response_id: int | None, sample: int) -> None:
        self.queries.append(_Query(len(self.queries), response_id, sample))
        self._waiting.append(self.queries[-1])
        self._assign()

    def _assign(self) -> None:
        """Waiting queries take free slots, their prefills ready in turn (the lock held)."""
        while self._waiting and self._free:
            query = self._waiting.popleft()
            query.slot = self._free.pop(0)
            self._ready.append((query, None))

    def _in_flight(self) -> bool:
        return bool(self._waiting) or len(self._free) < self.g.streams

    def _first_token(self, response_id: int, token: int) -> None:
        # lazy for start-up: mlperf_loadgen
        import mlperf_loadgen as lg

        data = np.array([token], dtype=np.int32)
        lg.FirstTokenComplete([lg.QuerySampleResponse(response_id, data.ctypes.data, data.nbytes, 1)])

    def _answer(self, ids: list[int], tokens: list[list[int]]) -> None:
        """LoadGen's responses: each query's tokens (LoadGen copies them before it returns)."""
        # lazy for start-up: mlperf_loadgen
        import mlperf_loadgen as lg

        arrays = [np.ascontiguousarray(t, dtype=np.int32) for t in tokens]
        lg.QuerySamplesComplete([lg.QuerySampleResponse(i, a.ctypes.data if a.size else 0, a.nbytes, a.size)
                                 for i, a in zip(ids, arrays)])
        self.answered += len(ids)

    def part(self) -> dict[str, Any]:
        """Stage 1's ``generation`` part: the slots, and each measured query's sample (its prompt's
        index in the library), prompt length and tokens."""
        measured = [q for q in self.queries if q.response_id is not None and q.done_s is not None]
        return {"streams": self.g.streams, "queries": len(measured), "samples": [q.sample for q in measured],
                "prompt_tokens": [len(self.library[q.sample]) for q in measured],
                "tokens": [q.tokens for q in measured]}
