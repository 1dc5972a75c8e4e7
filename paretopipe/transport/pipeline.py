"""The pipeline's schedule as pure data, and the one driver that runs it over a stage endpoint.

As in torchgpipe (``clock_cycles``) and ``torch.distributed.pipelining`` (``_Action`` lists), the
order of work is decided here, apart from the sockets and ranks that carry it: a schedule is a
list of :class:`Action` per stage, testable without any transport, and :func:`drive` hands each
action to the endpoint that owns the buffers and the link. Every backend's data source (TCP
stage 1, the RPC master) and every later TCP stage (a middle stage forwards, the last returns
the result) runs through :func:`drive`.

A language model's generation is the same pipeline with a feedback edge: each step of a stream
(one batch) takes the token its previous step produced. Its schedule is
:func:`generation_actions`: before a step's ``load``, ``feedback`` waits for the result of the
step it feeds on (the last stage's token, back at the source). Every stream's step t goes before
any stream's step t + 1, so with S streams S steps are in flight, one per stream.

The data source's actions per batch are ``load`` (the next input), ``admit`` (wait for a slot in
the window of ``in_flight`` batches, then stamp the batch's start on the source's clock),
``compute`` (its own part) and ``send``; a guarded run (a deadline, or an adaptive split) then
``settle``s the batch (its result, or the rest of the model at the source); after the last batch,
``drain`` waits for every result.
A later stage's are ``recv`` (the next batch its endpoint has buffered), ``compute`` and ``send``
(to the next stage, or the result back towards the source). Results are taken off the link by
the endpoint as they arrive, so a result's time is stamped when it lands, not when the driver
gets to it.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterable, Iterator, Protocol, Sequence, runtime_checkable

OPS = ("load", "admit", "compute", "send", "settle", "drain", "recv", "feedback")
#: What an endpoint's ``recv`` returns when its upstream has finished the run (no more batches).
STOP = object()


@dataclasses.dataclass(frozen=True)
class Action:
    """One step of one stage: ``op`` on batch ``batch`` (``None`` for ``drain``)."""

    op: str
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown pipeline action {self.op!r}; valid: {', '.join(OPS)}")


def source_actions(total: int, settle: bool = False) -> list[Action]:
    """The data source's schedule for ``total`` batches (warm-up included). With ``settle`` each
    batch is settled before the next is loaded: its result waited for up to a deadline, or the
    batch finished at the source (a guarded run: one batch in flight, the split free to change
    between two)."""
    ops = ("load", "admit", "compute", "send") + (("settle",) if settle else ())
    return [Action(op, i) for i in range(total) for op in ops] + [Action("drain")]


def open_source_actions(more: Callable[[], bool]) -> Iterator[Action]:
    """The data source's schedule when the load decides how many batches there are (a LoadGen
    scenario): before each batch, ``more()`` waits for the next one or says the run has ended;
    after the last, ``drain``."""
    for seq in itertools.count():
        if not more():
            break
        yield from (Action(op, seq) for op in ("load", "admit", "compute", "send"))
    yield Action("drain")


@dataclasses.dataclass(frozen=True)
class GenerationStep:
    """One batch of a generation: step ``step`` of stream ``stream``, whose input is the token of
    batch ``feeds_on`` (None: the stream's prompt, its prefill)."""

    stream: int
    step: int
    feeds_on: int | None


def generation_steps(streams: int, gen_tokens: int, warmup_streams: int = 0,
                     warmup_tokens: int = 2) -> list[GenerationStep]:
    """A generation's batches in schedule order: the warm-up streams first, one after another
    (numbered after the measured ones), then the measured streams step by step."""
    out: list[GenerationStep] = []
    last: dict[int, int] = {}

    def add(stream: int, step: int) -> None:
        out.append(GenerationStep(stream, step, last.get(stream)))
        last[stream] = len(out) - 1

    for w in range(warmup_streams):
        for t in range(warmup_tokens):
            add(streams + w, t)
    for t in range(gen_tokens):
        for s in range(streams):
            add(s, t)
    return out


def generation_actions(steps: Sequence[GenerationStep], settle: bool = False) -> list[Action]:
    """The data source's schedule of a generation: a step that feeds on an earlier one's token
    waits for it (``feedback``) before its ``load``; then as any batch (``settle``: a guarded run
    settles each step before the next); ``drain`` at the end."""
    ops = ("load", "admit", "compute", "send", "settle") if settle else ("load", "admit", "compute", "send")
    out: list[Action] = []
    for seq, step in enumerate(steps):
        if step.feeds_on is not None:
            out.append(Action("feedback", seq))
        out += [Action(op, seq) for op in ops]
    return out + [Action("drain")]


def stage_actions(total: int | None) -> Iterable[Action]:
    """A later stage's schedule: at most ``total`` batches (None: until the source's end), each
    received, computed and sent."""
    seqs = itertools.count() if total is None else range(total)
    return (Action(op, i) for i in seqs for op in ("recv", "compute", "send"))


@runtime_checkable
class Endpoint(Protocol):
    """A stage's side of a run, as :func:`drive` runs a schedule over it: one method per action it
    takes part in, each given the action's batch. Every stage computes its part and sends it on."""

    def compute(self, batch: int) -> None: ...

    def send(self, batch: int) -> None: ...


@runtime_checkable
class SourceSteps(Endpoint, Protocol):
    """The data source's (:func:`source_actions`): a guarded run's source also ``settle``s each
    batch (:func:`source_actions` with ``settle``), which only TCP's stage 1 takes."""

    def load(self, batch: int) -> None: ...

    def admit(self, batch: int) -> None: ...

    def drain(self, batch: None) -> None: ...


@runtime_checkable
class PromptSteps(SourceSteps, Protocol):
    """A generation's source (:func:`generation_actions`): a step waits for the token it feeds on."""

    def feedback(self, batch: int) -> None: ...


@runtime_checkable
class StageSteps(Endpoint, Protocol):
    """A later stage's (:func:`stage_actions`): ``recv`` returns :data:`STOP` once upstream has no
    more batches."""

    def recv(self, batch: int) -> object: ...


def drive(actions: Iterable[Action], endpoint: SourceSteps | StageSteps) -> int:
    """Run ``actions`` in order over ``endpoint`` (``endpoint.compute(batch)``, ...); returns how
    many batches were computed. Stops early when a ``recv`` returns :data:`STOP` (the source sent
    fewer batches: an adaptive stage 2 that joined mid-run); an endpoint's exception ends the
    schedule, and so does an action the endpoint takes no part in, by name."""
    computed = 0
    for action in actions:
        step = getattr(endpoint, action.op, None)
        if step is None:
            raise TypeError(f"{type(endpoint).__name__} takes no {action.op!r} step, which its schedule asks for")
        result = step(action.batch)
        if action.op == "recv" and result is STOP:
            break
        computed += action.op == "compute"
    return computed


def clock_cycles(num_batches: int, num_stages: int, in_flight: int | None = None) -> Iterator[list[tuple[int, int]]]:
    """The lock-step view of a pipeline, as torchgpipe draws it: at each tick, the (batch, stage)
    pairs that compute at once. Batch ``i`` reaches stage ``j`` at tick ``i + j`` when nothing
    holds it back; a window of ``in_flight`` batches (the data source's) lets batch ``i`` start only
    once batch ``i - in_flight`` has left the last stage, so with ``in_flight=1`` one batch at a
    time walks the whole pipeline."""
    if num_batches < 0 or num_stages < 1:
        raise ValueError("a pipeline has at least one stage and no negative number of batches")
    window = num_batches if in_flight is None else max(1, in_flight)
    start = []
    for i in range(num_batches):
        # Batch i may enter once batch i - window has finished its last stage (tick start + stages - 1).
        earliest = start[i - 1] + 1 if i else 0
        if i >= window:
            earliest = max(earliest, start[i - window] + num_stages)
        start.append(earliest)
    ticks = (start[-1] + num_stages) if num_batches else 0
    for k in range(ticks):
        # Stage order within a tick, as torchgpipe lists it: the batch furthest along comes last.
        yield sorted(((i, k - start[i]) for i in range(num_batches) if 0 <= k - start[i] < num_stages),
                     key=lambda pair: pair[1])
