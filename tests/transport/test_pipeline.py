"""The pipeline's schedule (pure data, no sockets) and the one driver that runs it over an endpoint."""

from __future__ import annotations

import itertools

import pytest

from paretopipe.transport import pipeline
from paretopipe.transport.pipeline import Action, clock_cycles, drive, source_actions, stage_actions


def test_clock_cycles_match_torchgpipe_without_a_window():
    # torchgpipe's own test_clock_cycles: batch i reaches stage j at tick i + j.
    assert list(clock_cycles(1, 1)) == [[(0, 0)]]
    assert list(clock_cycles(1, 3)) == [[(0, 0)], [(0, 1)], [(0, 2)]]
    assert list(clock_cycles(3, 1)) == [[(0, 0)], [(1, 0)], [(2, 0)]]
    assert list(clock_cycles(3, 3)) == [[(0, 0)],
                                        [(1, 0), (0, 1)],
                                        [(2, 0), (1, 1), (0, 2)],
                                        [(2, 1), (1, 2)],
                                        [(2, 2)]]
    assert list(clock_cycles(4, 2)) == [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (1, 1)], [(3, 0), (2, 1)], [(3, 1)]]
    assert list(clock_cycles(0, 2)) == []


def test_a_window_of_one_walks_one_batch_through_the_whole_pipeline_at_a_time():
    assert list(clock_cycles(3, 2, in_flight=1)) == [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)], [(2, 0)], [(2, 1)]]


def test_a_window_of_two_lets_the_third_batch_in_only_when_the_first_has_left():
    cycles = list(clock_cycles(4, 3, in_flight=2))
    assert cycles == [[(0, 0)],
                      [(1, 0), (0, 1)],
                      [(1, 1), (0, 2)],
                      [(2, 0), (1, 2)],  # batch 0 left the last stage at tick 2
                      [(3, 0), (2, 1)],
                      [(3, 1), (2, 2)],
                      [(3, 2)]]


@pytest.mark.parametrize("m,n,w", list(itertools.product((1, 2, 5), (1, 2, 4), (1, 2, 3, None))))
def test_every_schedule_computes_each_pair_once_in_stage_order_within_its_window(m, n, w):
    cycles = list(clock_cycles(m, n, in_flight=w))
    tick_of = {pair: k for k, pairs in enumerate(cycles) for pair in pairs}
    assert sorted(tick_of) == [(i, j) for i in range(m) for j in range(n)]  # each pair exactly once
    assert sum(len(pairs) for pairs in cycles) == m * n
    for i in range(m):
        assert [tick_of[(i, j)] for j in range(n)] == list(range(tick_of[(i, 0)], tick_of[(i, 0)] + n))
        if i:
            assert tick_of[(i, 0)] > tick_of[(i - 1, 0)]  # batches enter in order
    for pairs in cycles:
        assert len({j for _, j in pairs}) == len(pairs)  # a stage computes one batch per tick
        in_pipeline = {i for i in range(m) if tick_of[(i, 0)] <= cycles.index(pairs) <= tick_of[(i, n - 1)]}
        assert len(in_pipeline) <= (w or m)


def test_the_source_loads_admits_computes_and_sends_each_batch_then_drains():
    acts = source_actions(2)
    assert acts == [Action("load", 0), Action("admit", 0), Action("compute", 0), Action("send", 0),
                    Action("load", 1), Action("admit", 1), Action("compute", 1), Action("send", 1),
                    Action("drain")]
    assert list(stage_actions(2)) == [Action("recv", 0), Action("compute", 0), Action("send", 0),
                                      Action("recv", 1), Action("compute", 1), Action("send", 1)]
    with pytest.raises(ValueError, match="unknown pipeline action 'fly'"):
        Action("fly", 0)


def test_an_open_ended_source_asks_before_each_batch_and_a_later_stage_runs_until_stopped():
    """A LoadGen run's schedule: as many batches as ``more`` says there are, asked one at a time
    (the next is decided only after the last was taken), then the drain."""
    answers, asked = iter([True, True, False]), []

    def more() -> bool:
        asked.append(len(asked))
        return next(answers)

    acts = pipeline.open_source_actions(more)
    assert next(acts) == Action("load", 0) and asked == [0]
    assert list(acts) == [Action("admit", 0), Action("compute", 0), Action("send", 0), Action("load", 1),
                          Action("admit", 1), Action("compute", 1), Action("send", 1), Action("drain")]
    assert asked == [0, 1, 2]
    endless = stage_actions(None)
    assert [next(endless) for _ in range(9)][-3:] == [Action("recv", 2), Action("compute", 2), Action("send", 2)]
    ep = _Recorder(batches_upstream=3)
    assert drive(stage_actions(None), ep) == 3  # until the source's end (recv's STOP)


class _Recorder:
    def __init__(self, batches_upstream: int) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.left = batches_upstream

    def __getattr__(self, op):
        def call(batch):
            self.calls.append((op, batch))
            if op == "recv":
                if not self.left:
                    return pipeline.STOP
                self.left -= 1
            return None
        return call


def test_the_driver_runs_the_actions_in_order_and_stops_when_upstream_has_no_more():
    ep = _Recorder(batches_upstream=2)
    assert drive(stage_actions(4), ep) == 2
    assert ep.calls == [("recv", 0), ("compute", 0), ("send", 0), ("recv", 1), ("compute", 1), ("send", 1),
                        ("recv", 2)]
    src = _Recorder(batches_upstream=0)
    assert drive(source_actions(3), src) == 3
    assert src.calls == [(a.op, a.batch) for a in source_actions(3)]


def test_an_endpoint_failure_ends_the_schedule_there():
    class Failing(_Recorder):
        def compute(self, batch):
            if batch == 1:
                raise RuntimeError("stage broke")
            self.calls.append(("compute", batch))

    ep = Failing(batches_upstream=5)
    with pytest.raises(RuntimeError, match="stage broke"):
        drive(stage_actions(5), ep)
    assert ep.calls[-1] == ("recv", 1) and ("send", 1) not in ep.calls


def test_a_guarded_source_settles_each_batch_before_it_loads_the_next():
    """One batch in flight at a time by construction: settle (the result, or the rest of the model
    at the source) comes between a batch's send and the next batch's load, so a split may change
    between two batches and never under one."""
    acts = source_actions(2, settle=True)
    assert acts == [Action("load", 0), Action("admit", 0), Action("compute", 0), Action("send", 0), Action("settle", 0),
                    Action("load", 1), Action("admit", 1), Action("compute", 1), Action("send", 1), Action("settle", 1),
                    Action("drain")]
    assert source_actions(3) == [a for a in source_actions(3, settle=True) if a.op != "settle"]


def test_a_generation_feeds_each_streams_token_into_its_next_step():
    """The feedback edge: a step after the first waits for its stream's previous step, the warm-up
    streams run one after another first, and every stream's step t goes before any stream's t + 1."""
    steps = pipeline.generation_steps(streams=2, gen_tokens=3, warmup_streams=1, warmup_tokens=2)
    assert [(s.stream, s.step, s.feeds_on) for s in steps] == [
        (2, 0, None), (2, 1, 0),                              # the warm-up stream, numbered after the measured
        (0, 0, None), (1, 0, None), (0, 1, 2), (1, 1, 3), (0, 2, 4), (1, 2, 5)]
    actions = pipeline.generation_actions(steps)
    assert actions[:5] == [Action(op, 0) for op in ("load", "admit", "compute", "send")] + [Action("feedback", 1)]
    assert actions.count(Action("feedback", 4)) == 1 and actions[-1] == Action("drain")
    assert sum(a.op == "feedback" for a in actions) == 5  # every step but the prefills


def test_the_driver_runs_a_generation_over_an_endpoint_that_answers_each_step():
    """A scripted source: each step's result (its token, the step number plus one) comes back at
    once; the token fed into each step is its stream's previous one."""
    steps = pipeline.generation_steps(streams=2, gen_tokens=3)

    class Source:
        def __init__(self):
            self.tokens, self.fed = {}, []

        def feedback(self, seq):
            assert steps[seq].feeds_on in self.tokens  # the token it feeds on is already back

        def load(self, seq):
            step = steps[seq]
            self.fed.append((step.stream, step.step, None if step.feeds_on is None else self.tokens[step.feeds_on]))

        def admit(self, seq):
            pass

        def compute(self, seq):
            pass

        def send(self, seq):
            self.tokens[seq] = 100 * steps[seq].stream + steps[seq].step

        def drain(self, _):
            pass

    source = Source()
    assert drive(pipeline.generation_actions(steps), source) == 6
    assert source.fed == [(0, 0, None), (1, 0, None), (0, 1, 0), (1, 1, 100), (0, 2, 1), (1, 2, 101)]


def test_every_endpoint_the_runtime_drives_has_the_steps_of_its_schedule():
    from paretopipe.transport.rpc.master import _MasterPrompts, _MasterSource
    from paretopipe.transport.tcp.promptrun import PromptStage1Run
    from paretopipe.transport.tcp.sink import SinkRun
    from paretopipe.transport.tcp.source import Stage1Run

    assert issubclass(Stage1Run, pipeline.SourceSteps) and issubclass(_MasterSource, pipeline.SourceSteps)
    # A generation's sources wait for the token a step feeds on; an image source has no such step.
    assert issubclass(PromptStage1Run, pipeline.PromptSteps) and issubclass(_MasterPrompts, pipeline.PromptSteps)
    assert not issubclass(Stage1Run, pipeline.PromptSteps) and not issubclass(_MasterSource, pipeline.PromptSteps)
    assert hasattr(Stage1Run, "settle")  # the one source a guarded schedule runs over
    assert issubclass(SinkRun, pipeline.StageSteps) and not issubclass(SinkRun, pipeline.SourceSteps)


def test_an_action_the_endpoint_takes_no_part_in_is_refused_by_name():
    class ComputeOnly:
        def compute(self, batch):
            pass

        def send(self, batch):
            pass

    with pytest.raises(TypeError, match="ComputeOnly takes no 'recv' step, which its schedule asks for"):
        drive(stage_actions(1), ComputeOnly())
