"""A language model's device profile is every block's compute per phase, measured here; the cost
model adds stages and links by the arithmetic its docstring states; validate pairs predictions
with a sweep's measurements."""

from __future__ import annotations

import json

import pytest

from conftest import PYTHON
from paretopipe.errors import UsageError
from paretopipe.llm import shapes
from paretopipe.network.conditions import get_conditions
from paretopipe.predict import lm_costmodel
from tcp_helpers import run

SHAPE = shapes.named("tiny-lm")


def _profile(prefill: float, decode: float, model: str = "tiny-lm") -> dict:
    n = SHAPE.num_blocks
    return {"kind": "llm-profile", "model": model, "blocks": shapes.block_names(SHAPE),
            "prompt_lens": {"16": {"prefill_s": [prefill] * n, "decode_s": [decode] * n}}}


def test_predictions_add_each_stages_blocks_and_the_link():
    edge, server = _profile(0.010, 0.002), _profile(0.001, 0.0002)
    nets = get_conditions("3g")
    rows = lm_costmodel.predict(SHAPE, [edge, server], nets, 16)
    assert [r["split"] for r in rows] == list(range(7))
    r = rows[3]  # three blocks on the edge, four on the server
    up_bytes = 16 * 256
    assert r["predicted_ttft_s"] == pytest.approx(3 * 0.010 + 4 * 0.001 + 0.3 + up_bytes * 8 / 768e3
                                                  + lm_costmodel.RESULT_BYTES * 8 / 1600e3)
    assert r["predicted_tpot_s"] == pytest.approx(3 * 0.002 + 4 * 0.0002 + 0.3 + 256 * 8 / 768e3
                                                  + lm_costmodel.RESULT_BYTES * 8 / 1600e3)
    # a longer prompt than profiled: the prefill scales with its length, the decode does not
    longer = lm_costmodel.predict(SHAPE, [edge, server], None, 32)[3]
    assert longer["stage1_prefill_s"] == pytest.approx(2 * 3 * 0.010) and longer["stage1_decode_s"] == pytest.approx(0.006)


def test_a_profile_of_another_model_is_refused():
    with pytest.raises(UsageError, match="cannot predict tiny-lm"):
        lm_costmodel.predict(SHAPE, [_profile(1, 1, "smollm2-135m"), _profile(1, 1)], None, 16)


def test_validate_pairs_each_measured_configuration():
    import pandas as pd

    rows = lm_costmodel.predict(SHAPE, [_profile(0.001, 0.001), _profile(0.001, 0.001)], None, 16)
    measured = pd.DataFrame([{"network": "unshaped", "prompt_len": 16, "split_index": str(r["split"]),
                              "status": "complete", "ttft_median_s": r["predicted_ttft_s"] * 2,
                              "tpot_median_s": r["predicted_tpot_s"]} for r in rows[:3]])
    check = lm_costmodel.validate(rows, measured)
    assert check["configurations"] == 3 and check["ttft_median_abs_error"] == pytest.approx(0.5)
    assert check["tpot_median_abs_error"] == pytest.approx(0.0)


def test_profile_then_predict_from_the_command_line(tmp_path):
    out = tmp_path / "p.json"
    res = run([PYTHON, "-m", "paretopipe", "profile", "--model", "tiny-lm", "--prompt-len", "8,32", "--threads", "1",
               "--decode-steps", "4", "--repetitions", "2", "--out", str(out)], timeout=120)
    assert res.returncode == 0, res.stderr
    prof = json.loads(out.read_text())
    assert prof["blocks"] == shapes.block_names(SHAPE) and set(prof["prompt_lens"]) == {"8", "32"}
    for plen, phase in prof["prompt_lens"].items():
        assert len(phase["prefill_s"]) == len(phase["decode_s"]) == 7 and min(phase["decode_s"]) > 0
        assert phase["decode_context"] == [int(plen), int(plen) + 4]
    res = run([PYTHON, "-m", "paretopipe", "predict", "--model", "tiny-lm", "--device-profiles", f"{out},{out}",
               "--network", "lan,3g", "--prompt-len", "8"], timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("\n") == 1 + 2 * 7


def _blockwise(prefill: list[float], decode: list[float]) -> dict:
    return {"kind": "llm-profile", "model": "tiny-lm", "blocks": shapes.block_names(SHAPE),
            "prompt_lens": {"16": {"prefill_s": prefill, "decode_s": decode}}}


def test_a_chain_of_two_devices_is_the_split_model_and_a_longer_one_adds_its_hops_and_stages():
    edge, server = _profile(0.010, 0.002), _profile(0.001, 0.0002)
    nets = get_conditions("3g")
    rows = lm_costmodel.predict(SHAPE, [edge, server], nets, 16)
    phases = lm_costmodel.phases_at(SHAPE, [edge, server], 16)
    for r in rows:
        for objective in ("ttft", "tpot"):
            assert lm_costmodel.chain_cost(SHAPE, phases, nets, 16, [r["split"]], objective) == \
                pytest.approx(r[f"predicted_{objective}_s"])
    three = lm_costmodel.phases_at(SHAPE, [edge, server, server], 16)
    # Two hops forward, each token back over both (a middle stage relays it): blocks 2..4 on the second device.
    hop = 0.15 + 256 * 8 / 768e3 + 0.15 + lm_costmodel.RESULT_BYTES * 8 / 1600e3
    assert lm_costmodel.chain_cost(SHAPE, three, nets, 16, [2, 4], "tpot") == pytest.approx(
        2 * 0.002 + 2 * 0.0002 + 3 * 0.0002 + 2 * hop)


def test_the_best_chain_is_the_least_of_every_plan():
    import itertools
    import random

    rnd = random.Random(7)
    n = SHAPE.num_blocks
    devices = [_blockwise([rnd.uniform(1e-3, 9e-3) for _ in range(n)], [rnd.uniform(1e-4, 9e-4) for _ in range(n)])
               for _ in range(3)]
    for conditions in (None, get_conditions("wifi")):
        for objective in ("ttft", "tpot"):
            phases = lm_costmodel.phases_at(SHAPE, devices, 16)
            value, cuts = lm_costmodel.best_chain(SHAPE, phases, conditions, 16, objective)
            every = [(lm_costmodel.chain_cost(SHAPE, phases, conditions, 16, list(c), objective), c)
                     for c in itertools.combinations(range(SHAPE.last_split + 1), 2)]
            assert value == pytest.approx(min(v for v, _ in every))
            assert value == pytest.approx(lm_costmodel.chain_cost(SHAPE, phases, conditions, 16, list(cuts), objective))
            assert cuts[0] < cuts[1] and len(cuts) == 2  # a chain runs increasing splits
    with pytest.raises(UsageError, match="at most 8 stages"):
        lm_costmodel.best_chain(SHAPE, lm_costmodel.phases_at(SHAPE, devices * 3, 16), None, 16, "tpot")


def test_a_slow_third_device_costs_time_per_token_and_the_command_says_so(tmp_path):
    from paretopipe.predict import subsets

    pi, server, slow = _profile(0.004, 0.0008), _profile(0.001, 0.0002), _profile(0.020, 0.004)
    priced = subsets.price_generation(SHAPE, [pi, server, slow], get_conditions("wifi"), 16)
    assert [p.devices for p in priced] == subsets.placements(3)
    rows = {(r["objective"], r["devices"]): r
            for r in subsets.marginal_gains(priced, ["pi", "server", "slow"], subsets.GENERATION_OBJECTIVES)}
    assert rows[("tpot", 2)]["placement"] == "pi -> server"
    assert rows[("tpot", 3)]["gain"] == "loss" and rows[("tpot", 3)]["vs_one_fewer"] > 1
    paths = []
    for name, prof in (("pi", pi), ("server", server), ("slow", slow)):
        (tmp_path / f"{name}.json").write_text(json.dumps(prof))
        paths.append(str(tmp_path / f"{name}.json"))
    out = run([PYTHON, "-m", "paretopipe", "predict", "--model", "tiny-lm", "--device-profiles", ",".join(paths),
               "--network", "wifi", "--prompt-len", "16", "--subsets", "--out", str(tmp_path / "pred")], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "4 placements, pi the data source" in out.stdout and "pi -> server -> slow" in out.stdout
    assert "tpot       3 devices" in out.stdout and "the extra device costs" in out.stdout
    table = (tmp_path / "pred" / "subsets.csv").read_text().splitlines()
    assert table[0].startswith("network,prompt_len,objective,devices,placement,value") and len(table) == 1 + 4
    two = run([PYTHON, "-m", "paretopipe", "predict", "--model", "tiny-lm", "--device-profiles", ",".join(paths)],
              timeout=120)
    assert two.returncode == 2 and "--subsets takes more" in two.stderr
