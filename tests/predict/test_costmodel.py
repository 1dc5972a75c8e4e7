"""Cost model terms on hand-computed cases, the protocol replay, and the DP planner vs brute force."""

from __future__ import annotations

import math
import random

import pytest

from paretopipe.errors import UsageError
from paretopipe.network.conditions import MSS_BYTES, get_conditions
from paretopipe.predict import planner
from paretopipe.predict.costmodel import RESULT_META_BYTES, LinkModel, chain_terms, simulate
from paretopipe.predict.device_profile import check_compatible, codec_key, resolve_cipher, synthetic_profile

MS = 1e-3


def test_link_terms_hand_computed():
    link = LinkModel.of(delay_s=0.020, rate_bps=8e6, base_fixed_s=0.001, base_bytes_per_s=1e9)
    # 1e6 bytes at 8 Mbit/s = 1 s; + 20 ms delay; + 1 ms + 1e6/1e9 s beneath.
    assert link.time_s(1_000_000) == pytest.approx(1.0 + 0.020 + 0.001 + 0.001)
    assert link.busy_s(1_000_000) == pytest.approx(1.0)
    assert LinkModel().time_s(10**9) == 0.0  # unshaped, nothing beneath: free


def test_loss_adds_expected_retransmits():
    link = LinkModel.of(delay_s=0.050, rate_bps=10e6, loss_percent=1.0)
    n = 100 * MSS_BYTES
    seg = MSS_BYTES * 8 / 10e6
    # 100 segments x 1% = 1 expected loss, each resent one RTT (2 x 50 ms) later plus its own time.
    assert link.serialise_s(n) == pytest.approx(n * 8 / 10e6 + 1 * (seg + 0.100))


def test_jitter_expected_delay_is_clipped_at_zero():
    assert LinkModel.of(delay_s=0.035, jitter_s=0.005).expected_delay_s() == pytest.approx(0.035, abs=1e-9)
    # Zero mean delay with N(0, j) jitter: E[max(0, X)] = j / sqrt(2 pi).
    assert LinkModel.of(delay_s=0.0, jitter_s=0.010).expected_delay_s() == pytest.approx(0.010 / math.sqrt(2 * math.pi))
    # Uniform(-j, j) around 0: E[max(0, X)] = j / 4.
    assert LinkModel.of(jitter_s=0.008, distribution="uniform").expected_delay_s() == pytest.approx(0.002)
    rng = random.Random(1)
    mc = sum(max(0.0, 0.002 + rng.gauss(0, 0.004)) for _ in range(200_000)) / 200_000
    assert LinkModel.of(delay_s=0.002, jitter_s=0.004).expected_delay_s() == pytest.approx(mc, rel=0.01)


def test_link_from_the_named_conditions_file_values():
    up, down = LinkModel.pair(get_conditions("lte"), {"fixed_s": 0.0, "bytes_per_s": None})
    assert (up.direction.delay_s, up.direction.rate_bps) == (0.035, 12e6)
    assert down == up


def _two_devices():
    # 3 segments: 10, 20, 30 ms on device 1; 1, 2, 3 ms on device 2 (ten times faster).
    bytes_ = [600, 4000, 1000, 40]
    edge = synthetic_profile([10 * MS, 20 * MS, 30 * MS], bytes_, source_s=2 * MS, encode_s=0.5 * MS,
                             decode_s=0.25 * MS, frame_overhead=56)
    server = synthetic_profile([1 * MS, 2 * MS, 3 * MS], bytes_, encode_s=0.1 * MS, decode_s=0.05 * MS,
                               frame_overhead=56)
    return edge, server


def test_chain_terms_hand_computed():
    edge, server = _two_devices()
    link = LinkModel.of(delay_s=0.010, rate_bps=1e6)  # 1 Mbit/s: 1 byte = 8 us
    t = chain_terms([edge, server], [link], [2], 1)  # segments 0,1 on the edge, 2 on the server
    assert t.compute_s == pytest.approx([30 * MS, 3 * MS])
    assert t.frame_bytes == [1056]
    result_bytes = 40 + 56 + RESULT_META_BYTES
    fwd = 0.010 + 1056 * 8e-6
    back = 0.010 + result_bytes * 8e-6
    expected = 30 * MS + 0.5 * MS + fwd + 0.05 * MS + 3 * MS + 0.1 * MS + back + 0.25 * MS
    assert t.latency_s() == pytest.approx(expected)
    busy = t.busy_terms()
    assert busy["stage1"] == pytest.approx(2 * MS + 30 * MS + 0.5 * MS + 0.25 * MS)
    assert busy["link1"] == pytest.approx(1056 * 8e-6)
    assert busy["stage2"] == pytest.approx(0.05 * MS + 3 * MS + 0.1 * MS)
    assert t.bottleneck() == ("stage1", pytest.approx(busy["stage1"]))
    assert t.throughput_imgs_per_s() == pytest.approx(1 / busy["stage1"])
    row = t.as_row()
    assert row["predicted_latency_s"] == pytest.approx(expected) and row["predicted_bottleneck"] == "stage1"


def _sealing(fixed_s: float, bytes_per_s: float) -> dict:
    fit = {"fixed_s": fixed_s, "bytes_per_s": bytes_per_s}
    return {"aesgcm": {"seal": fit, "open": fit}}


def test_a_sealed_data_port_adds_each_devices_seal_and_open_per_frame_and_a_tag():
    bytes_ = [600, 4000, 1000, 40]
    # Sealing or opening n bytes: 10 us + n / 100 MB/s on the edge, 1 us + n / 1 GB/s on the server.
    edge = synthetic_profile([10 * MS, 20 * MS, 30 * MS], bytes_, source_s=2 * MS, encode_s=0.5 * MS,
                             decode_s=0.25 * MS, frame_overhead=56, ciphers=_sealing(10e-6, 1e8))
    server = synthetic_profile([1 * MS, 2 * MS, 3 * MS], bytes_, encode_s=0.1 * MS, decode_s=0.05 * MS,
                               frame_overhead=56, ciphers=_sealing(1e-6, 1e9))
    link = LinkModel.of(delay_s=0.010, rate_bps=1e6)
    plain = chain_terms([edge, server], [link], [2], 1)
    sealed = chain_terms([edge, server], [link], [2], 1, codec_key("float32", "none", "aesgcm"))
    result = 40 + 56 + RESULT_META_BYTES
    # The edge seals the 1056-byte activation and opens the result; the server opens the one, seals the other.
    # (the profile knows the result frame without its meta: 96 bytes opened)
    edge_seal, edge_open = 10e-6 + 1056 / 1e8, 10e-6 + 96 / 1e8
    server_open, server_seal = 1e-6 + 1056 / 1e9, 1e-6 + result / 1e9
    assert sealed.frame_bytes == [1056 + 16] and sealed.result_bytes == result + 16
    assert sealed.parts[0].encode_s == pytest.approx(0.5 * MS + edge_seal)
    assert sealed.parts[0].decode_s == pytest.approx(0.25 * MS + edge_open)
    assert sealed.parts[1].decode_s == pytest.approx(0.05 * MS + server_open)
    assert sealed.parts[1].encode_s == pytest.approx(0.1 * MS + server_seal)
    tags = 2 * 16 * 8e-6  # 16 more bytes each way at 1 Mbit/s
    assert sealed.latency_s() - plain.latency_s() == pytest.approx(edge_seal + edge_open + server_open + server_seal
                                                                   + tags)
    with pytest.raises(UsageError, match="has no chacha20 timings.*--ciphers chacha20"):
        chain_terms([edge, server], [link], [2], 1, codec_key("float32", "none", "chacha20"))


def test_auto_resolves_as_the_stages_would_from_the_profiles_aes_flags():
    def profile(aes):
        return synthetic_profile([MS], [4, 4], aes_instructions=aes)

    assert resolve_cipher("auto", [profile(True), profile(True)]) == "aesgcm"
    assert resolve_cipher("auto", [profile(False), profile(True)]) == "chacha20"  # a Pi 4 and a server
    assert resolve_cipher("chacha20", [profile(True), profile(True)]) == "chacha20"
    with pytest.raises(UsageError, match="does not say whether its CPU has AES"):
        resolve_cipher("auto", [profile(None), profile(True)])


def test_slow_link_becomes_the_bottleneck_and_baselines_are_included():
    edge, server = _two_devices()
    slow = LinkModel.of(rate_bps=0.1e6)
    everything_remote = chain_terms([edge, server], [slow], [0], 1)
    assert everything_remote.compute_s == [0.0, pytest.approx(6 * MS)]
    assert everything_remote.bottleneck()[0] == "link1"
    everything_local = chain_terms([edge, server], [slow], [3], 1)
    assert everything_local.compute_s == [pytest.approx(60 * MS), 0.0]


def test_simulate_matches_closed_forms():
    edge, server = _two_devices()
    t = chain_terms([edge, server], [LinkModel.of(delay_s=0.010, rate_bps=1e6)], [2], 1)
    # Window 1: every batch sees the empty pipeline, so latency is the sum of the terms.
    one = simulate(t, num_batches=20, warmup=2, in_flight=1)
    assert one["predicted_latency_s"] == pytest.approx(t.latency_s())
    # A deep window keeps the pipeline full: throughput is batch / bottleneck.
    deep = simulate(t, num_batches=200, warmup=20, in_flight=64)
    assert deep["predicted_throughput_imgs_per_s"] == pytest.approx(t.throughput_imgs_per_s(), rel=1e-6)


def test_simulate_window_bound_when_the_link_is_slow():
    # Source-free stage 1 and a link twice as slow as anything else: a window of W batches queues
    # at the link, so each batch waits behind W - 1 others: latency -> W x link time.
    p = synthetic_profile([1 * MS, 1 * MS], [100, 10_000, 40], encode_s=0.0, decode_s=0.0)
    link = LinkModel.of(rate_bps=8e6)  # 10 kB -> 10 ms
    t = chain_terms([p, p], [link], [1], 1)
    sim = simulate(t, num_batches=100, warmup=10, in_flight=4)
    assert sim["predicted_throughput_imgs_per_s"] == pytest.approx(1 / 0.010, rel=1e-3)
    assert sim["predicted_latency_s"] == pytest.approx(4 * 0.010, rel=0.02)


def test_dp_planner_equals_brute_force():
    rng = random.Random(7)
    for trial in range(25):
        n_seg = rng.randint(3, 7)
        bytes_ = [rng.randint(50, 5000) for _ in range(n_seg)] + [40]
        devices = [synthetic_profile([rng.uniform(0.1, 5) * MS * speed for _ in range(n_seg)], bytes_,
                                     source_s=rng.uniform(0, 1) * MS, encode_s=rng.uniform(0, 0.2) * MS,
                                     decode_s=rng.uniform(0, 0.2) * MS, frame_overhead=56)
                   for speed in [rng.choice([0.1, 1, 4]) for _ in range(rng.randint(2, 4))]]
        links = [LinkModel.of(delay_s=rng.uniform(0, 20) * MS, rate_bps=rng.choice([1e6, 10e6, 100e6]))
                 for _ in devices[1:]]
        positions = sorted(rng.sample(range(n_seg + 1), rng.randint(2, n_seg + 1)))
        dp = planner.pareto_plans(devices, links, 1, positions)
        bf = planner.brute_force_plans(devices, links, 1, positions)
        assert [(round(p.latency_s, 12), round(p.bottleneck_s, 12)) for p in dp] == \
               [(round(p.latency_s, 12), round(p.bottleneck_s, 12)) for p in bf], trial
        for plan in dp:  # and every DP plan's objectives are what the full model says
            t = chain_terms(devices, links, list(plan.cuts), 1)
            assert (t.latency_s(), t.bottleneck()[1]) == (pytest.approx(plan.latency_s), pytest.approx(plan.bottleneck_s))


def test_planner_prints_rpc_split_blocks():
    p = synthetic_profile([1 * MS] * 4, [10] * 5, blocks={0: 0, 1: 2, 2: 4})
    plan = planner.Plan((2, 4), 0.1, 0.01, 1)
    assert planner.split_blocks(plan, p) == "1,2"
    assert planner.split_blocks(planner.Plan((1, 2), 0.1, 0.01, 1), p) == "cut1,cut2"


def test_profiles_of_another_model_are_refused_and_other_torch_warns():
    a = synthetic_profile([MS, MS], [1, 1, 1])
    b = synthetic_profile([MS, MS], [1, 1, 1], model="resnet18")
    with pytest.raises(UsageError, match="profiles resnet18, not mobilenet_v2"):
        check_compatible([a, b], "mobilenetv2")
    old = synthetic_profile([MS, MS], [1, 1, 1], torch_version="1.13.0")
    warnings = check_compatible([a, old], "mobilenet_v2")
    assert any("torch 1.13.0" in w for w in warnings)
    with pytest.raises(UsageError, match="no timings at batch size 8 .*--batch-sizes 8"):
        a.stage_compute_s(8, 0, 1)
    with pytest.raises(UsageError, match="no float16/zstd codec timings"):
        a.codec(1, 0, "float16/zstd")


def test_stage_compute_pays_the_call_overhead_once():
    # Chained segments each paid one call; a stage of m segments is one call: m - 1 fewer.
    p = synthetic_profile([10 * MS, 20 * MS, 30 * MS], [1, 1, 1, 1], call_overhead_s=1 * MS)
    assert p.stage_compute_s(1, 0, 3) == pytest.approx(58 * MS)
    assert p.stage_compute_s(1, 1, 2) == pytest.approx(20 * MS)
    assert p.stage_compute_s(1, 2, 2) == 0.0
