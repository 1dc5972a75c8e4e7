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
