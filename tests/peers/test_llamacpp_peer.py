"""llama.cpp's RPC split as a peer of our engine, for real: the built ``llama-server`` and
``ggml-rpc-server`` (make test-peers builds them first: scripts/build_llamacpp.sh), the real
SmolLM2-135M-Instruct GGUF, its traffic through the relay, and one sweep over both engines at the
same cut. What crosses per token is counted on the link, and what llama.cpp is known to send (the
whole logits vector back each token) must show there."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import PYTHON
from paretopipe.envfile import read_env
from paretopipe.errors import PeerError
from paretopipe.llm import checkpoints
from paretopipe.controller.llamacpp_peer import LlamaCppPeer
from paretopipe.controller import hosts
from paretopipe.controller.processes import Placement
from paretopipe.transport.runconfig import Generation, RunConfig
from tcp_helpers import run

pytestmark = pytest.mark.peers
MODEL = "smollm2-135m-instruct"
HIDDEN, VOCAB, LAYERS = 576, 49152, 30
SPLIT = 16  # the embedding and 15 layers on stage 1: -ngl 16 (the 15 others and the head)
PLAN = (10, 20)  # three stages: 9 layers on stage 1, 10 on the first server, 11 and the head on the second


def _rows(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Both engines at one cut on an unshaped link and behind a 20 ms one-way delay, stage 1 on
    half a core (a slower device, for both engines)."""
    tmp = tmp_path_factory.mktemp("peer-sweep")
    nets = tmp / "nets.toml"
    nets.write_text('[lan]\n[delay20]\ndelay = "20ms"\n')
    res = run([PYTHON, "-m", "paretopipe", "sweep", "--model", MODEL, "--engine", "torch,llamacpp", "--splits",
               str(SPLIT), "--network", "lan,delay20", "--network-file", str(nets), "--prompt-len", "16",
               "--gen-tokens", "12", "--runs", "1", "--threads", "1", "--stage-cpu", "0.5,none",
               "--out", str(tmp / "res"), "--session", "s"], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "res" / "s"


def test_both_engines_are_measured_at_the_same_cut_with_their_counts_per_token(swept):
    rows = {(r["engine"], r["network"]): r for r in _rows(swept / "summary.csv")}
    assert set(rows) == {(e, n) for e in ("torch", "llamacpp") for n in ("lan", "delay20")}
    for network in ("lan", "delay20"):
        ours, theirs = rows[("torch", network)], rows[("llamacpp", network)]
        assert float(ours["bytes_per_token"]) == HIDDEN * 4  # our hidden state at float32, one way
        assert float(ours["round_trips_per_token"]) == 1.0
        # llama.cpp sends the logits of the whole vocabulary back each token (float32), then its
        # graph and hidden state up: counted on the link by the relay
        assert VOCAB * 4 <= float(theirs["down_bytes_per_token"]) < VOCAB * 4 * 1.1
        assert HIDDEN * 4 < float(theirs["bytes_per_token"]) < 64_000
        assert 0.9 <= float(theirs["round_trips_per_token"]) <= 3.0
    # a lower bound from the link, whatever this machine's speed: a round trip per token at 2 x 20 ms
    assert float(rows[("llamacpp", "delay20")]["tpot_median_s"]) >= 0.040


def test_the_record_names_the_build_the_gguf_and_the_split_as_ngl(swept):
    rec = json.loads(next((swept / "runs").glob("*llamacpp*.json")).read_text())
    engine = rec["manifest"]["stages"][0]["engine"]
    assert engine["ngl"] == LAYERS + 2 - SPLIT  # -ngl counts the head as a layer
    # llama-server's own account of where the layers went (its KV buffers), checked against the split
    assert engine["loaded"]["layers"]["CPU"] == SPLIT - 1 and engine["loaded"]["output_offloaded"]
    assert sorted(engine["loaded"]["layers"].values()) == sorted([SPLIT - 1, LAYERS + 1 - SPLIT])
    assert engine["gguf"]["quantisation"] == "Q4_1" and engine["gguf"]["layers"] == LAYERS
    assert "-DGGML_RPC=ON" in engine["build"]["flags"] and engine["version"] == "0.3.36"
    assert rec["generation"]["stages"][0]["layers"] == [0, SPLIT - 1]
    # --stage-cpu 0.5,none: llama-server ran in a cgroup of half a core, ggml-rpc-server in none
    stage1, stage2 = (s["limits"] for s in rec["manifest"]["stages"])
    assert stage1["cpu_share"] == 0.5 and "paretopipe-llamacpp-llama-server" in stage1["cgroup"]
    assert "cpu_share" not in stage2
    assert [len(t) for t in rec["generation"]["tokens"]] == [12]
    assert rec["summary"]["server_tpot_median_s"] > 0


def test_the_report_sets_llamacpp_beside_ours_with_the_cost_models_prediction(swept):
    res = run([PYTHON, "-m", "paretopipe", "report", str(swept)], timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    table = {(r["engine"], r["network"]): r for r in _rows(swept / "report" / "peer_llamacpp.csv")}
    predicted = table[("llamacpp", "delay20")]
    assert float(predicted["tpot_predicted_s"]) > 0.040 and predicted["tpot_prediction_error"] != ""
    # the same dequantised weights, greedy: the two engines' first tokens agree on a real model
    assert float(predicted["tokens_agree_with_torch"]) > 0
    assert (swept / "report" / "peer_llamacpp_bytes.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def chained(tmp_path_factory):
    """Both engines on a plan of three stages (--split-blocks): ours a chain, llama.cpp's client
    and two ggml-rpc-servers, each behind a relay of its own."""
    tmp = tmp_path_factory.mktemp("peer-plan")
    res = run([PYTHON, "-m", "paretopipe", "sweep", "--model", MODEL, "--engine", "torch,llamacpp", "--split-blocks",
               ",".join(map(str, PLAN)), "--network", "lan", "--prompt-len", "16", "--gen-tokens", "12", "--runs", "1",
               "--threads", "1", "--out", str(tmp / "res"), "--session", "s"], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "res" / "s"


def test_a_plan_of_three_stages_runs_llamacpp_on_two_servers_as_a_star(chained, swept):
    rows = {r["engine"]: r for r in _rows(chained / "summary.csv")}
    ours, theirs = rows["torch"], rows["llamacpp"]
    assert float(ours["hop1_bytes_per_token"]) == float(ours["hop2_bytes_per_token"]) == HIDDEN * 4
    # llama.cpp's client talks to each server itself: a turn with each per token, its graph and the
    # hidden state up to each, and back the first server's hidden state as well as the logits
    assert float(theirs["round_trips_per_token"]) == pytest.approx(2.0, abs=0.3)
    assert float(theirs["hop1_bytes_per_token"]) > HIDDEN * 4 and float(theirs["hop2_bytes_per_token"]) > HIDDEN * 4
    assert VOCAB * 4 + HIDDEN * 4 <= float(theirs["down_bytes_per_token"]) < VOCAB * 4 * 1.1
    rec = json.loads(next((chained / "runs").glob("*llamacpp*.json")).read_text())
    stages = rec["manifest"]["stages"]
    assert [s["program"] for s in stages] == ["llama-server", "ggml-rpc-server", "ggml-rpc-server"]
    assert len({s["pid"] for s in stages}) == 3
    engine = stages[0]["engine"]
    assert engine["ngl"] == LAYERS + 2 - PLAN[0] and engine["tensor_split"] == [10, 12]
    assert sorted(engine["loaded"]["layers"].values()) == [9, 10, 11]  # llama-server's own account
    assert [s["layers"] for s in rec["generation"]["stages"]] == [[0, 9], [9, 19], [19, 30]]
    # the same weights and prompt, greedy, on the same CPU kernels: two servers or one, the same tokens
    two = next(json.loads(p.read_text()) for p in (swept / "runs").glob("*llamacpp*.json")
               if json.loads(p.read_text())["config"]["network"] == "lan")
    assert rec["generation"]["tokens"] == two["generation"]["tokens"]


def test_a_gguf_llamacpp_refuses_fails_the_run_with_its_reason(tmp_path):
    """A GGUF whose header reads but whose tensors are not there: llama-server exits, and the run
    fails in one line that carries llama.cpp's own reason."""
    import gguf  # the real extra's, as the conversion's

    path = tmp_path / "hollow.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([b"a", b"b", b"c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    peer = LlamaCppPeer(Placement(hosts.Testbed(), ["cpu", "cpu"], [1, 1], [None, None], wait_time=60,
                                  model_dir=str(path)), "hollow")
    try:
        peer.start()
        cfg = RunConfig(model="hollow", cuts=["lm2"], split_index=2, batch_size=1, num_batches=1, warmup=0,
                        engine="llamacpp", generation=Generation(gen_tokens=2, prompt_len=2, warmup_streams=0))
        with pytest.raises(PeerError, match=r"llama-server exited \(1\): .*error loading model") as err:
            peer.run(cfg, None, None, 60.0)
        assert "\n" not in str(err.value)
        assert peer.alive()  # its workers stay up for the sweep's next configuration
    finally:
        peer.stop()


@pytest.mark.root
@pytest.mark.lab
def test_on_a_three_host_lab_llamacpp_runs_each_placement_over_a_link_tc_shapes(tmp_path):
    """Hosts from the lab's .env, in each placement's order: ggml-rpc-server's workers listen on
    the data port, which tc shapes (rate only: htb on any kernel); llama-server, the relays and
    the runs on host 1, over SSH. --placements 1-2 runs the split 16 on two hosts, 1-3-2 the plan with
    its first server on host 3 (--split-blocks gives each as many stages as it has hosts). What crosses is still counted by the relays, and the rate bounds
    the time per token."""
    from lab_helpers import lab

    nets = tmp_path / "nets.toml"
    nets.write_text('[slow]\nrate = "20mbit"\ncomment = "rate only: htb shapes it on any kernel"\n')
    with lab("ppll", 3, subnet=71) as made:
        done = run([PYTHON, "-m", "paretopipe", "sweep", "--env-file", str(made.env_file), "--model", MODEL,
                    "--engine", "llamacpp", "--split-blocks", f"{SPLIT};{PLAN[0]},{PLAN[1]}",
                    "--placements", "1-2,1-3-2", "--network-file", str(nets), "--network", "slow",
                    "--prompt-len", "16", "--gen-tokens", "8", "--runs", "1", "--threads", "1",
                    "--out", str(tmp_path / "res"), "--session", "s"], timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["placement"]: r for r in _rows(tmp_path / "res" / "s" / "summary.csv")}
    assert set(rows) == {"1-2", "1-3-2"} and {r["status"] for r in rows.values()} == {"complete"}
    for row in rows.values():
        assert row["engine"] == "llamacpp"
        assert VOCAB * 4 <= float(row["down_bytes_per_token"]) < VOCAB * 4 * 1.1
        up = sum(float(row[f"hop{j}_bytes_per_token"] or 0) for j in (1, 2))
        assert float(row["tpot_median_s"]) >= (up + float(row["down_bytes_per_token"])) * 8 / 20e6  # the shaped rate
    assert float(rows["1-3-2"]["round_trips_per_token"]) == pytest.approx(2.0, abs=0.3)
    recs = {r["config"]["placement"]: r for r in (json.loads(p.read_text())
                                                  for p in (tmp_path / "res" / "s" / "runs").glob("*.json"))}
    chain = recs["1-3-2"]
    assert chain["config"]["link_mode"] == "tc" and "tc" in chain["manifest"]["link"]["note"]
    stages = chain["manifest"]["stages"]
    assert [s["program"] for s in stages] == ["llama-server", "ggml-rpc-server", "ggml-rpc-server"]
    # 1-3-2: the first server on host 3, the second on host 2 (each at the data port tc shapes)
    host, port = made.addresses(), hosts.Testbed.from_env(read_env(str(made.env_file))).data_port
    assert [s["rpc"] for s in stages[1:]] == [f"{host[2]}:{port}", f"{host[1]}:{port}"]
    assert recs["1-2"]["manifest"]["stages"][1]["rpc"] == f"{host[1]}:{port}"
    assert sorted(stages[0]["engine"]["loaded"]["layers"].values()) == [9, 10, 11]


def test_the_real_model_is_known_to_both_engines():
    assert checkpoints.real_file(MODEL).suffix == ".gguf"
