"""Split LM runs on the one pipeline's stage commands (partition1.py/partition2.py), as real
processes over the TCP data port: the tokens equal the unsplit model's at every kind of cut and
through a chain of three, the record's bytes and KV cache are what the shapes say, and bad input
or a hostile peer ends in one line."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pytest
import torch

from conftest import PYTHON
from paretopipe.errors import WireError
from paretopipe.llm import build, generate, prompts, shapes
from paretopipe.llm.builder import LMBuilder
from paretopipe.transport import tcp, wire
from paretopipe.transport.runconfig import Generation, RunConfig
from paretopipe.transport.tcp.connection import Connection
from tcp_helpers import free_port, run, start, wait_for_line

GEN = 8


@pytest.fixture(scope="module")
def reference():
    src = build.source("tiny-lm")
    model = generate.reference_model(src)
    return src, model


def _want(reference, stream: int, prompt_len: int = 12, seed: int = 0) -> list[int]:
    src, model = reference
    prompt = prompts.seeded_prompt(prompt_len, src.shape.vocab_size, seed, stream)
    return generate.generate_unsplit(model, prompt, GEN)[0]


def _run_pair(tmp_path, split: str, *extra: str):
    port = free_port()
    out = tmp_path / "out"
    s1 = start("partition1.py", "--model", "tiny-lm", "--split", split, "--port", str(port), "--host", "127.0.0.1",
               "--prompt-len", "12", "--gen-tokens", str(GEN), "--streams", "2", "--out", str(out),
               "--save-outputs", str(tmp_path / "tokens.npz"), "--connect-timeout", "60", *extra)
    wait_for_line(s1, "listening", 60)
    procs = [start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port), "--out",
                   str(tmp_path / "stage2"))]
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
    assert record["status"] == "complete" and record["generation"]["tokens"] == got.tolist()
    assert record["config"]["generation"]["streams"] == 2 and record["config"]["cuts"] == [f"lm{split}"]
    s = record["summary"]
    assert s["bytes_per_token"] == shapes.cut_bytes_per_token(src.shape, split)  # 8 B of ids, or 64 x 4
    assert s["prefill_bytes"] == 2 * 12 * s["bytes_per_token"]  # two streams' prompts of 12 tokens
    positions = 12 + GEN - 1
    for j, stage in enumerate(record["generation"]["stages"]):
        layers = len(shapes.stage_layers(src.shape, [split], j))
        assert stage["kv_bytes"] == 2 * 2 * 16 * 4 * layers * positions * 2  # both streams
        assert s[f"stage{j + 1}_kv_bytes"] == stage["kv_bytes"]
    steps = [b for b in record["batches"] if not b["warmup"]]
    assert len(steps) == 2 * GEN and sum(b["step"] == 0 for b in steps) == 2  # each stream's prefill, then decode
    assert all(b["stage1_compute_s"] > 0 and b["stage2_compute_s"] > 0 for b in steps)
    assert s["tokens_generated"] == 2 * GEN and 0 < s["ttft_median_s"] and 0 < s["tpot_median_s"] <= s["tpot_p99_s"]
    assert s["throughput_imgs_per_s"] is None and s["tokens_per_s"] > 0
    assert "ttft" in out and "time per token" in out and "(modelled)" in out
    # modelled energy, as an image run's: each stage's CPU seconds in its window x its busy-core watts, per token
    cpu = [record["resources"][f"stage{j}"]["cpu_s"] for j in (1, 2)]
    assert s["energy_modelled_per_token_j"] == pytest.approx((0.9 * cpu[0] + 15 * cpu[1]) / (2 * GEN))
    assert "energy_modelled_per_image_j" not in s


def test_a_chain_of_three_generates_the_same_tokens(reference, tmp_path):
    record, got, _, _ = _chain(tmp_path, free_port())  # stage 3 connects to stage 2's --next-port
    assert got.tolist() == [_want(reference, 0), _want(reference, 1)]
    assert [s["layers"] for s in record["generation"]["stages"]] == [[0, 0], [0, 3], [3, 4]]
    assert [record["summary"][f"hop{j}_bytes_per_token"] for j in (1, 2)] == [256, 256]
    assert record["manifest"]["link"]["mode"] == "emulated"


def _chain(tmp_path, next_port: int):
    port = free_port()
    out = tmp_path / "out"
    s1 = start("partition1.py", "--model", "tiny-lm", "--split", "1,4", "--port", str(port), "--host", "127.0.0.1",
               "--prompt-len", "12", "--gen-tokens", str(GEN), "--streams", "2", "--out", str(out),
               "--save-outputs", str(tmp_path / "tokens.npz"), "--network", "lan")
    wait_for_line(s1, "listening", 60)
    s2 = start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port),
               "--next-port", str(next_port), "--next-host", "127.0.0.1", "--out", str(tmp_path / "s2"))
    s3 = start("partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(next_port), "--out",
               str(tmp_path / "s3"))
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
    real = run([PYTHON, "partition2.py", "--model", "tiny-lm", "--host", "127.0.0.1", "--port", str(port), "--out",
                str(tmp_path / "s2")], timeout=60)
    assert real.returncode == 0, real.stderr
    s1.communicate(timeout=60)
    assert s1.returncode == 0


@pytest.fixture(scope="module")
def builder():
    return LMBuilder("tiny-lm")


def _config(builder, split: int = 3, **changes) -> dict:
    cfg = RunConfig(model=builder.name, cuts=[f"lm{split}"], split_index=split, timeout_s=10,
                    generation=Generation(gen_tokens=4, streams=1, prompt_len=5, warmup_streams=0))
    return {**cfg.to_dict(), **changes}


def _scripted_stage1(builder, config: dict):
    """A stage 1 speaking the protocol by hand over a socket pair, and the real later stage."""
    mine, theirs = socket.socketpair()
    up = Connection(mine, None, "test", wire.DEFAULT_MAX_PAYLOAD)
    down = Connection(theirs, None, "test", wire.DEFAULT_MAX_PAYLOAD)
    failure: list[BaseException] = []

    def serve():
        try:
            tcp.serve_connection(down, builder)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    up.send(wire.RUN, meta={"run_id": "scripted", "config": config, "link": {"mode": "none"}})
    return up, thread, failure


@pytest.mark.parametrize("tensor, why", [
    (torch.zeros(1, 5, 32), "hidden state (1, T, 64)"),
    (torch.zeros(1, 5, 64, dtype=torch.float16), "as float32"),
    (torch.full((1, 5, 64), float("nan")), "NaN"),
])
def test_a_frame_with_the_wrong_hidden_state_is_refused_in_one_line(builder, tensor, why):
    up, thread, failure = _scripted_stage1(builder, _config(builder))
    wire.expect(up.reader.read(), wire.RUN_OK)
    up.send(wire.TENSOR, 0, tensor, meta={"stream": 0, "start": 0, "step": 0})
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and why in reply.meta["reason"]
    thread.join(10)
    assert failure and isinstance(failure[0], WireError) and why in str(failure[0])


def test_a_decode_step_out_of_place_is_refused(builder):
    up, thread, failure = _scripted_stage1(builder, _config(builder))
    wire.expect(up.reader.read(), wire.RUN_OK)
    up.send(wire.TENSOR, 0, torch.zeros(1, 1, 64), meta={"stream": 0, "start": 7, "step": 1})
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and "holds 0 positions, the input starts at 7" in reply.meta["reason"]
    thread.join(10)
    assert failure and "holds 0 positions" in str(failure[0])


def test_a_run_configuration_of_the_wrong_types_is_refused_by_name(builder):
    cfg = _config(builder)
    up, thread, failure = _scripted_stage1(builder, {**cfg, "generation": {**cfg["generation"], "gen_tokens": "4"}})
    reply = up.reader.read()
    assert reply.kind == wire.ERROR and "gen_tokens" in reply.meta["reason"]
    thread.join(10)
    assert failure and isinstance(failure[0], WireError)


@pytest.mark.parametrize("args, needle", [
    (["--split", "9"], "out of range for tiny-lm: 0..6"),
    (["--split", "3", "--prompt-len", "510", "--gen-tokens", "8"], "the model has 512"),
    (["--split", "3", "--model-dir", "/nonexistent-folder"], "no config.json"),
    (["--split", "3,2"], "increasing order"),
    (["--split", "3", "--batch-size", "4"], "--batch-size applies to an image model"),
    (["--split", "adaptive"], "a language model runs a static split"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    res = run([PYTHON, "partition1.py", "--model", "tiny-lm", "--port", str(free_port()), *args], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_generation_flags_are_refused_for_an_image_model():
    res = run([PYTHON, "partition1.py", "--model", "mobilenetv2", "--split", "3", "--gen-tokens", "4"], timeout=60)
    assert res.returncode == 2 and "--gen-tokens applies to a language model" in res.stderr, res.stderr


def test_float32_logits_over_tcp_agree_with_the_unsplit_model_at_every_step(reference, tmp_path):
    record, got, out, _ = _run_pair(tmp_path, "2", "--check-exact")
    exact = record["generation"]["exactness"]
    assert exact["steps"] == 2 * GEN and exact["token_agreement"] == 1.0
    assert exact["max_logit_diff"] < 1e-5
    assert "tokens agree 100%" in out


def test_an_int8_cut_records_what_it_costs_against_float32(reference, tmp_path):
    record, got, _, _ = _run_pair(tmp_path, "3", "--cut-dtype", "int8")
    s = record["summary"]
    assert s["bytes_per_token"] == 64 + 2 * 4  # int8 values and one float32 scale per 32 values of a token
    assert record["config"]["wire_dtype"] == "int8" and record["config"]["generation"]["check_exact"]
    assert 0.0 <= s["token_agreement"] <= 1.0 and 0.0 < s["max_logit_diff"] < 0.5
    assert s["max_logit_diff"] == record["generation"]["exactness"]["max_logit_diff"]
