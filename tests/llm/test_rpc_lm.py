"""A split language model over PyTorch RPC, with distributed_runner.py's own flags, as real rank
processes: the tokens equal the unsplit model's through a chain of three ranks with the master
computing stage 1, and with the master holding only the prompts; the record adds up; a plan that
does not fit the world is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PYTHON
from paretopipe.llm import build, generate, prompts
from tcp_helpers import run


@pytest.fixture(scope="module")
def reference():
    src = build.source("tiny-lm")
    return src, generate.reference_model(src)


@pytest.mark.parametrize("source, world", [("stage1", 3), ("master", 4)])
def test_tokens_over_rpc_equal_the_unsplit_model_through_three_stages(reference, tmp_path, source, world):
    src, model = reference
    res = run([PYTHON, "distributed_runner.py", "--local", "--world-size", str(world), "--num-partitions", "3",
               "--rpc-source", source, "--model", "tiny-lm", "--split-blocks", "1,4", "--prompt-len", "10",
               "--gen-tokens", "6", "--streams", "2", "--network", "wifi", "--out", str(tmp_path), "--save-outputs",
               str(tmp_path / "t.npz"), "--rpc-transport", "uv", "--threads", "1"], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    want = [generate.generate_unsplit(model, prompts.seeded_prompt(10, 260, 0, s), 6)[0] for s in (0, 1)]
    assert np.load(tmp_path / "t.npz")["tokens"].tolist() == want
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["backend"] == "rpc" and record["status"] == "complete" and record["generation"]["tokens"] == want
    assert [record["summary"][f"hop{j}_bytes_per_token"] for j in (1, 2)] == [256, 256]
    layers = [s.get("layers") for s in record["generation"]["stages"]]
    assert layers == [[0, 0], [0, 3], [3, 4]]
    assert record["manifest"]["link"]["conditions"]["name"] == "wifi"
    assert record["manifest"]["rpc"]["stage_ranks"] == ([0, 1, 2] if source == "stage1" else [1, 2, 3])
    assert "rpc ttft" in res.stdout


def test_a_plan_that_does_not_fit_the_world_is_one_line():
    res = run([PYTHON, "distributed_runner.py", "--local", "--world-size", "3", "--model", "tiny-lm",
               "--split-blocks", "1,4"], timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    # three stages (two cuts) and a master that only holds the prompts need four ranks
    assert len(lines) == 1 and "--num-partitions 3 must be within 1..2 for --world-size 3 with --rpc-source master" \
        in lines[0], res.stderr
