"""LoadGen's queries through the feed, with a consumer thread standing in for the pipeline (the
real pipeline is tests/transport/sut/test_harness.py): Offline's one query cut into batches of the run's
size, each sample answered once with its top-1 class, and a pipeline that dies answered empty so
that LoadGen's test returns instead of waiting forever."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from paretopipe.loadgen.settings import LoadgenOptions, make_test_settings
from paretopipe.transport.inputs import SampleSet
from paretopipe.transport.sut.feed import QueryFeed

lg = pytest.importorskip("mlperf_loadgen")


def _consume(feed: QueryFeed, seen: list, stop_after: int | None = None) -> threading.Thread:
    """The pipeline's part: every batch's images in, a logit row per image out (class = its first
    pixel's sign, so each sample's answer is known); it dies after ``stop_after`` batches."""
    def run():
        seq = 0
        while feed.more():
            x = feed.load(seq)
            seen.append(x.shape[0])
            if stop_after is not None and seq >= stop_after:
                return  # the pipeline is gone: this batch and all later ones are never answered
            time.sleep(0.002)
            logits = torch.zeros(x.shape[0], 10)
            logits[torch.arange(x.shape[0]), (x[:, 0, 0, 0] > 0).long()] = 1.0
            feed.complete(seq, logits)
            seq += 1
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _start(feed: QueryFeed, opts: LoadgenOptions, tmp, total: int) -> threading.Thread:
    settings = make_test_settings(opts, expected_latency_s=0.002, expected_qps=500.0)
    log = lg.LogSettings()
    log.log_output.outdir, log.log_output.copy_summary_to_stdout, log.enable_trace = str(tmp), False, False

    def test():
        sut, qsl = lg.ConstructSUT(feed.issue, feed.flush), lg.ConstructQSL(total, total, feed.load_samples,
                                                                              feed.unload_samples)
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
            feed.end()
    t = threading.Thread(target=test, daemon=True)
    t.start()
    return t


def test_offlines_query_is_cut_into_batches_and_every_sample_answered_with_its_class(tmp_path):
    samples = SampleSet("synthetic", 8, 12, seed=3)
    feed = QueryFeed(samples, batch_size=5, query_size=None, keep_predictions=True)
    opts = LoadgenOptions(scenario="offline", mode="accuracy", min_duration_s=0.5, min_query_count=1)
    seen: list = []
    consumer = _consume(feed, seen)
    _start(feed, opts, tmp_path, len(samples)).join(60)
    consumer.join(10)
    assert seen == [5, 5, 2] and feed.answered == 12  # accuracy mode: every sample once, one query
    assert feed.predictions == {i: int(samples.image(i)[0, 0, 0] > 0) for i in range(12)}


def test_a_pipeline_that_dies_mid_test_is_abandoned_and_loadgen_returns(tmp_path):
    samples = SampleSet("synthetic", 8, 4)
    feed = QueryFeed(samples, batch_size=1, query_size=1, keep_predictions=False)
    opts = LoadgenOptions(scenario="singlestream", min_duration_s=30.0, min_query_count=1000)
    seen: list = []
    consumer = _consume(feed, seen, stop_after=5)
    test = _start(feed, opts, tmp_path, len(samples))
    consumer.join(30)
    assert not consumer.is_alive() and len(seen) == 6
    started = time.monotonic()
    feed.abandon()  # what the source does when its schedule fails
    test.join(30)
    assert not test.is_alive() and time.monotonic() - started < 10
    assert feed.dead and feed.answered >= 6  # the five answered, and the stranded one
    assert feed.more() is False  # the source's schedule ends
