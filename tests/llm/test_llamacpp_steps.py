"""A llama.cpp run's steps from its relays' counts and its streams' arrival times, without
llama.cpp: one relay (two stages) and two (a plan of three, a star around stage 1)."""

from __future__ import annotations

import pytest

from paretopipe.llm import llamacpp
from paretopipe.llm.llamacpp_steps import TokenMarks, server_figures, token_steps
from paretopipe.llm.summary import hop_bytes
from paretopipe.network.relay import RelayCounts


def test_each_step_takes_the_relays_counts_since_the_token_before():
    """Two streams in one batch: the first token to arrive at a mark carries its bytes, the other
    none, so the mean over steps is the batch's bytes per token."""
    a = llamacpp.Streamed(sent_s=10.0, tokens=[5, 6, 7], events=[(10.5, 1), (10.6, 1), (10.7, 1)])
    b = llamacpp.Streamed(sent_s=10.0, tokens=[8, 9], events=[(10.55, 1), (10.6, 1)])
    marks = TokenMarks()
    marks.seen = [(10.5, [RelayCounts(up_bytes=1000, down_bytes=200_000, round_trips=3)]),
                  (10.55, [RelayCounts(up_bytes=1100, down_bytes=400_000, round_trips=4)]),
                  (10.6, [RelayCounts(up_bytes=1200, down_bytes=600_000, round_trips=5)]),
                  (10.7, [RelayCounts(up_bytes=1300, down_bytes=800_000, round_trips=6)])]
    steps = token_steps([a, b], marks, [RelayCounts()])
    assert [(s["stream"], s["step"], s["wire_bytes"], s["result_wire_bytes"], s["round_trips"]) for s in steps] == [
        (0, 0, 1000, 200_000, 3), (0, 1, 100, 200_000, 1), (0, 2, 100, 200_000, 1),
        (1, 0, 100, 200_000, 1), (1, 1, 0, 0, 0)]
    assert steps[1]["start_s"] == pytest.approx(0.5) and steps[1]["latency_s"] == pytest.approx(0.1)
    assert steps[0]["latency_s"] == pytest.approx(0.5)  # the first token: time to first token


def test_tokens_held_back_share_their_events_time_and_counts_and_keep_the_totals():
    """llama-server holds a token that ends inside a UTF-8 character and sends it with the next:
    the event's interval and counts are shared, the first event's held token takes the run's
    per-token figures, and nothing is lost or counted twice."""
    s = llamacpp.Streamed(sent_s=0.0, tokens=[1, 2, 3, 4, 5], events=[(0.30, 2), (0.40, 1), (0.60, 2)])
    marks = TokenMarks()
    marks.seen = [(0.30, [RelayCounts(up_bytes=50_000, down_bytes=400_000, round_trips=2)]),
                  (0.40, [RelayCounts(up_bytes=51_000, down_bytes=600_000, round_trips=3)]),
                  (0.60, [RelayCounts(up_bytes=53_000, down_bytes=1_000_000, round_trips=5)])]
    steps = token_steps([s], marks, [RelayCounts()])
    assert [st["end_s"] for st in steps] == pytest.approx([0.20, 0.30, 0.40, 0.50, 0.60])
    assert [st["wire_bytes"] for st in steps] == pytest.approx([49_000, 1000, 1000, 1000, 1000])
    assert [st["result_wire_bytes"] for st in steps[1:]] == pytest.approx([200_000] * 4)
    assert sum(st["round_trips"] for st in steps) == pytest.approx(5)
    assert [st["token"] for st in steps] == [1, 2, 3, 4, 5]


def test_with_two_servers_each_hop_takes_its_own_relays_bytes_and_the_turns_add_up():
    """Stage 1 talks to each server itself: what went up to server j is hop j's (the summary's
    hop columns), what came back and the round trips are every relay's together."""
    s = llamacpp.Streamed(sent_s=0.0, tokens=[1, 2, 3], events=[(0.3, 1), (0.4, 1), (0.5, 1)])
    marks = TokenMarks()

    def both(k: int) -> list[RelayCounts]:  # per token: 6,000 up and 2,304 back from A; 5,000 up and the logits from B
        return [RelayCounts(up_bytes=6000 * k, down_bytes=2304 * k, round_trips=k),
                RelayCounts(up_bytes=5000 * k, down_bytes=196_616 * k, round_trips=k)]
    marks.seen = [(0.3, both(1)), (0.4, both(2)), (0.5, both(3))]
    steps = token_steps([s], marks, both(0))
    assert [(st["wire_bytes"], st["stage2_wire_bytes"], st["result_wire_bytes"], st["round_trips"])
            for st in steps] == [(6000, 5000, 2304 + 196_616, 2)] * 3
    assert hop_bytes(steps, 2) == [(6000, 6000.0), (5000, 5000.0)]


def test_llama_servers_own_timings_are_its_medians_in_seconds():
    streams = [llamacpp.Streamed(sent_s=0.0, timings={"prompt_ms": 30.0, "predicted_per_token_ms": 9.0}),
               llamacpp.Streamed(sent_s=0.0, timings={"prompt_ms": 50.0, "predicted_per_token_ms": 11.0}),
               llamacpp.Streamed(sent_s=0.0, timings={})]
    assert server_figures(streams) == pytest.approx({"server_ttft_median_s": 0.04, "server_tpot_median_s": 0.01})


def test_a_one_time_burst_after_the_prompt_is_not_spread_over_every_token():
    """llama.cpp's first decode step re-sends its graph's buffers; whether the relay's marks give
    those bytes to the prompt or to the first decode steps is a matter of timing. A token's
    figure is the typical step's, the same either way."""
    steady, burst = 7358, 129_000
    s = llamacpp.Streamed(sent_s=0.0, tokens=list(range(8)), events=[(0.1 * (i + 1), 1) for i in range(8)])
    for late in (False, True):  # the burst counted before the first token's mark, or after it
        ups = [300_000 + (0 if late else burst)] + [steady + (burst if late and i == 0 else 0) for i in range(7)]
        marks = TokenMarks()
        marks.seen = [(0.1 * (i + 1), [RelayCounts(up_bytes=sum(ups[:i + 1]), down_bytes=196_616 * (i + 1),
                                                   round_trips=i + 1)]) for i in range(8)]
        steps = token_steps([s], marks, [RelayCounts()])
        assert hop_bytes(steps, 1)[0][1] == steady
