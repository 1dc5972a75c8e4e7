"""The worker that runs llama.cpp's client side, without llama.cpp: how a run's steps take the
relay's counts and the stream's times, tokens held back by llama-server included, and its command
line refused where it names no server. Its runs with llama.cpp are tests/peers."""

from __future__ import annotations

import pytest

from paretopipe.errors import UsageError
from paretopipe.llm import llamacpp
from paretopipe.network.relay import RelayCounts
from paretopipe.runners.llamacpp_worker import ClientSide, PeerOptions, _Marks, _steps


def test_each_step_takes_the_relays_counts_since_the_token_before():
    """Two streams in one batch: the first token to arrive at a mark carries its bytes, the other
    none, so the mean over steps is the batch's bytes per token."""
    a = llamacpp.Streamed(sent_s=10.0, tokens=[5, 6, 7], events=[(10.5, 1), (10.6, 1), (10.7, 1)])
    b = llamacpp.Streamed(sent_s=10.0, tokens=[8, 9], events=[(10.55, 1), (10.6, 1)])
    marks = _Marks()
    marks.seen = [(10.5, RelayCounts(up_bytes=1000, down_bytes=200_000, round_trips=3)),
                  (10.55, RelayCounts(up_bytes=1100, down_bytes=400_000, round_trips=4)),
                  (10.6, RelayCounts(up_bytes=1200, down_bytes=600_000, round_trips=5)),
                  (10.7, RelayCounts(up_bytes=1300, down_bytes=800_000, round_trips=6))]
    steps = _steps([a, b], marks, RelayCounts())
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
    marks = _Marks()
    marks.seen = [(0.30, RelayCounts(up_bytes=50_000, down_bytes=400_000, round_trips=2)),
                  (0.40, RelayCounts(up_bytes=51_000, down_bytes=600_000, round_trips=3)),
                  (0.60, RelayCounts(up_bytes=53_000, down_bytes=1_000_000, round_trips=5))]
    steps = _steps([s], marks, RelayCounts())
    assert [st["end_s"] for st in steps] == pytest.approx([0.20, 0.30, 0.40, 0.50, 0.60])
    assert [st["wire_bytes"] for st in steps] == pytest.approx([49_000, 1000, 1000, 1000, 1000])
    assert [st["result_wire_bytes"] for st in steps[1:]] == pytest.approx([200_000] * 4)
    assert sum(st["round_trips"] for st in steps) == pytest.approx(5)
    assert [st["token"] for st in steps] == [1, 2, 3, 4, 5]


def test_a_client_without_a_servers_address_is_refused_in_one_line(monkeypatch):
    side = ClientSide.__new__(ClientSide)  # the address is checked before anything starts
    side.opts = PeerOptions(side="client", model="smollm2-135m-instruct", rpc="no-port")
    with pytest.raises(UsageError, match=r"--rpc 'no-port': give HOST:PORT"):
        side.start()


def test_the_workers_command_line_round_trips():
    opts = PeerOptions(side="server", model="smollm2-135m-instruct", threads=1, cpus="1", host="0.0.0.0", port=5555)
    assert PeerOptions.parse(opts.to_argv(), "w", "d") == opts
