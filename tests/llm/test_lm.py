"""Split LM runs over the TCP data port, as real processes: the tokens equal the unsplit model's
at every kind of cut and through a chain of three, the record's bytes and KV cache are what the
shapes say, and bad input or a hostile peer ends in one line."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe.errors import WireError
from paretopipe.llm import build, generate, shapes, tokens
from paretopipe.transport import wire
from paretopipe.transport.tcp.connection import Connection
from paretopipe.transport.lmrun import LMRunConfig
from paretopipe.transport.tcp.lm import LMRunStart, serve_lm_connection
from tcp_helpers import free_port, run, start, wait_for_line

GEN = 8


@pytest.fixture(scope="module")
def reference():
    src = build.source("tiny-lm")
    model = generate.reference_model(src)
    return src, model


def _want(reference, stream: int, prompt_len: int = 12, seed: int = 0) -> list[int]:
    src, model = reference
    prompt = tokens.seeded_prompt(prompt_len, src.shape.vocab_size, seed, stream)
    return generate.generate_unsplit(model, prompt, GEN)[0]


def _run_pair(tmp_path, split: str, *extra: str):
    port = free_port()
    out = tmp_path / "out"
    s1 = start("partition1.py", "--model", "tiny-lm", "--split", split, "--port", str(port), "--host", "127.0.0.1",
               "--prompt-len", "12", "--gen-tokens", str(GEN), "--streams", "2", "--out", str(out),
               "--save-outputs", str(tmp_path / "tokens.npz"), "--connect-timeout", "60", *extra)
    wait_for_line(s1, "listening", 60)
    procs = [start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port))]
    s1_out, s1_err = s1.communicate(timeout=120)
    later_out = [p.communicate(timeout=60) for p in procs]
    assert s1.returncode == 0, s1_err[-2000:]
    assert all(p.returncode == 0 for p in procs), later_out
    record = json.loads(next(out.glob("*.json")).read_text())
    return record, np.load(tmp_path / "tokens.npz")["tokens"], s1_out, later_out


@pytest.mark.parametrize("split", [0, 3, 6])
def test_tokens_over_tcp_equal_the_unsplit_model_and_the_record_adds_up(reference, tmp_path, split):
    src, _ = reference
    record, got, out, _ = _run_pair(tmp_path, str(split), "--power-idle-w", "2.7,40", "--power-core-w", "0.9,15")
    assert got.tolist() == [_want(reference, 0), _want(reference, 1)]
    assert record["kind"] == "llm" and record["status"] == "complete" and record["tokens"] == got.tolist()
    hop = record["hops"][0]
    assert hop["bytes_per_token"] == shapes.cut_bytes_per_token(src.shape, split)  # 8 B of ids, or 64 x 4
    assert hop["prefill_bytes"] == 2 * 12 * hop["bytes_per_token"]  # two streams' prompts of 12 tokens
    positions = 12 + GEN - 1
    for j, stage in enumerate(record["stages"]):
        layers = len(shapes.stage_layers(src.shape, [split], j))
        assert stage["kv_bytes"] == 2 * 2 * 16 * 4 * layers * positions * 2  # both streams
        assert stage["peak_rss_bytes"] > 0
        assert len(stage["compute_decode_s"]) == 2 * (GEN - 1) and len(stage["compute_prefill_s"]) == 2
    s = record["summary"]
    assert s["tokens_generated"] == 2 * GEN and 0 < s["ttft_median_s"] and 0 < s["tpot_median_s"] <= s["tpot_p99_s"]
    assert len(record["steps"]) == 2 * GEN
    assert "ttft" in out and "time per token" in out and "(modelled)" in out
    # modelled energy: each stage's compute x its busy-core watts + its idle watts x the span, per token
    span = max(x["done_s"] for x in record["steps"]) - min(x["sent_s"] for x in record["steps"])
    busy = [sum(st["compute_prefill_s"]) + sum(st["compute_decode_s"]) for st in record["stages"]]
    want_j = (0.9 * busy[0] + 2.7 * span + 15 * busy[1] + 40 * span) / (2 * GEN)
    assert s["energy_per_token_modelled_j"] == pytest.approx(want_j)


def test_a_chain_of_three_generates_the_same_tokens(reference, tmp_path):
    record, got, _, _ = _chain(tmp_path, free_port())  # stage 3 connects to stage 2's --next-port
    assert got.tolist() == [_want(reference, 0), _want(reference, 1)]
    assert [s["stage"] for s in record["stages"]] == [1, 2, 3]
    assert [h["bytes_per_token"] for h in record["hops"]] == [256, 256]
    assert record["manifest"]["link"]


def _chain(tmp_path, next_port: int):
    port = free_port()
    out = tmp_path / "out"
    s1 = start("partition1.py", "--model", "tiny-lm", "--split", "1,4", "--port", str(port), "--host", "127.0.0.1",
               "--prompt-len", "12", "--gen-tokens", str(GEN), "--streams", "2", "--out", str(out),
               "--save-outputs", str(tmp_path / "tokens.npz"), "--network", "lan")
    wait_for_line(s1, "listening", 60)
    s2 = start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port),
               "--next-port", str(next_port), "--next-host", "127.0.0.1")
    s3 = start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(next_port))
    s1_out, s1_err = s1.communicate(timeout=120)
    later = [p.communicate(timeout=60) for p in (s2, s3)]
    assert s1.returncode == 0, s1_err[-2000:]
    assert s2.returncode == 0 and s3.returncode == 0, later
    return json.loads(next(out.glob("*.json")).read_text()), np.load(tmp_path / "tokens.npz")["tokens"], s1_out, later


def test_a_peer_with_another_model_is_refused_and_the_real_peer_is_served(reference, tmp_path):
    port = free_port()
    s1 = start("partition1.py", "--model", "tiny-lm", "--split", "2", "--port", str(port), "--host", "127.0.0.1",
               "--gen-tokens", "4", "--out", str(tmp_path), "--connect-timeout", "60")
    wait_for_line(s1, "listening", 60)
    stranger = run([PYTHON, "partition2.py", "--model", "smollm2-135m", "--host", "127.0.0.1", "--port", str(port),
                    "--connect-timeout", "10"], timeout=60)
    assert stranger.returncode == 1
    lines = stranger.stderr.strip().splitlines()
    assert len(lines) == 1 and "handshake mismatch" in lines[0] and "Traceback" not in stranger.stderr
    real = run([PYTHON, "partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port)], timeout=60)
    assert real.returncode == 0, real.stderr
    s1.communicate(timeout=60)
    assert s1.returncode == 0


def _scripted_stage1(src, splits: list[int]):
    """A stage 1 speaking the protocol by hand over a socket pair, and the real later stage."""
    mine, theirs = socket.socketpair()
    up = Connection(mine, None, "test", wire.DEFAULT_MAX_PAYLOAD)
    down = Connection(theirs, None, "test", wire.DEFAULT_MAX_PAYLOAD)
    failure: list[BaseException] = []

    def serve():
        try:
            serve_lm_connection(down, src)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    cfg = LMRunConfig(model=src.name, identity=src.identity(), splits=splits, gen_tokens=4, streams=1,
                      prompt_tokens=[5], warmup=0, timeout_s=10)
    import dataclasses

    up.send(wire.RUN, meta=dataclasses.asdict(LMRunStart("scripted", dataclasses.asdict(cfg))))
    wire.expect(up.reader.read(), wire.RUN_OK)
    return up, thread, failure


@pytest.mark.parametrize("tensor, why", [
    (torch.zeros(1, 5, 32), "hidden state (1, T, 64)"),
    (torch.zeros(1, 5, 64, dtype=torch.float16), "as float32"),
    (torch.full((1, 5, 64), float("nan")), "NaN"),
])
def test_a_frame_with_the_wrong_hidden_state_is_refused_in_one_line(reference, tensor, why):
    src, _ = reference
    up, thread, failure = _scripted_stage1(src, [3])
    up.send(wire.TENSOR, 1, tensor, meta={"stream": 0, "start": 0, "step": 0})
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and why in reply.meta["reason"]
    thread.join(10)
    assert failure and isinstance(failure[0], WireError) and why in str(failure[0])


def test_a_decode_step_out_of_place_is_refused(reference):
    src, _ = reference
    up, thread, failure = _scripted_stage1(src, [3])
    up.send(wire.TENSOR, 1, torch.zeros(1, 1, 64), meta={"stream": 0, "start": 7, "step": 1})
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and "holds 0 positions, the input starts at 7" in reply.meta["reason"]
    thread.join(10)


@pytest.mark.parametrize("args, needle", [
    (["--split", "9"], "out of range for tiny-lm: 0..6"),
    (["--split", "3", "--prompt-len", "510", "--gen-tokens", "8"], "the model has 512"),
    (["--split", "3", "--model-dir", "/nonexistent-folder"], "no config.json"),
    (["--split", "3,2"], "must increase"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    res = run([PYTHON, "partition1.py", "--model", "tiny-lm", "--port", str(free_port()), *args], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_float32_logits_over_tcp_agree_with_the_unsplit_model_at_every_step(reference, tmp_path):
    record, got, out, _ = _run_pair(tmp_path, "2", "--check-exact")
    exact = record["stages"][-1]["exactness"]
    assert exact["steps"] == 2 * GEN and exact["token_agreement"] == 1.0
    assert exact["max_logit_diff"] < 1e-5
    assert "tokens agree 100%" in out


def test_an_int8_cut_records_what_it_costs_against_float32(reference, tmp_path):
    record, got, _, _ = _run_pair(tmp_path, "3", "--cut-dtype", "int8")
    assert record["hops"][0]["bytes_per_token"] == 64 + 4  # int8 values and one float32 scale per token
    s = record["summary"]
    assert 0.0 <= s["token_agreement"] <= 1.0 and 0.0 < s["max_logit_diff"] < 0.5
    assert s["max_logit_diff"] == record["stages"][-1]["exactness"]["max_logit_diff"]


def test_a_run_configuration_of_the_wrong_types_is_refused_by_name(reference):
    import dataclasses

    src, _ = reference
    mine, theirs = socket.socketpair()
    up = Connection(mine, None, "test", wire.DEFAULT_MAX_PAYLOAD)
    failure: list[BaseException] = []
    thread = threading.Thread(target=lambda: _serve_into(Connection(theirs, None, "test", wire.DEFAULT_MAX_PAYLOAD),
                                                         src, failure), daemon=True)
    thread.start()
    cfg = dataclasses.asdict(LMRunConfig(model=src.name, identity=src.identity(), splits=[3], gen_tokens=4, streams=1,
                                         prompt_tokens=[5]))
    up.send(wire.RUN, meta=dataclasses.asdict(LMRunStart("bad", {**cfg, "splits": "3"})))
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and "splits" in reply.meta["reason"]
    thread.join(10)
    assert failure and isinstance(failure[0], WireError)


def _serve_into(connection, src, failure: list) -> None:
    try:
        serve_lm_connection(connection, src)
    except BaseException as exc:
        failure.append(exc)
