"""A TCP run's record from its stages' parts (transport.tcp.outcome): the parts are merged in stage
order, later stages' seal times join stage 1's batches by sequence number, a lying list of later
parts is refused, and the writing stage's endpoint finishes the record for its workload."""

from __future__ import annotations

import json

import pytest

from paretopipe.errors import WireError
from paretopipe.transport.runconfig import RunConfig
from paretopipe.transport.tcp.outcome import assemble_record, later_parts, merge_peer_seals, write_record


def _part(role: str, seqs=(0, 1), **batch) -> dict:
    return {"manifest": {"role": role}, "sysmon": {"cpu_percent": 10.0},
            "batches": [{"seq": s, "warmup": False, "latency_s": 0.01, "start_s": 0.01 * s, "end_s": 0.01 * (s + 1),
                         **batch} for s in seqs]}


def test_later_stages_seal_times_join_stage_1s_batches_by_sequence_number_and_nothing_else_does():
    first, second = _part("stage1"), _part("stage2", seqs=(1, 7), stage2_seal_s=0.002)
    second["batches"][0]["stage2_compute_s"] = 5.0  # not a seal time: stays in stage 2's own part
    second["batches"][1]["stage2_seal_s"] = 0.003  # a batch stage 1 never sent
    merge_peer_seals([first, second, None])
    assert "stage2_seal_s" not in first["batches"][0] and first["batches"][1]["stage2_seal_s"] == 0.002
    assert all("stage2_compute_s" not in b for b in first["batches"]) and len(first["batches"]) == 2
    for bad in (True, -1.0, 1e7, "0.1"):
        part = _part("stage1")
        merge_peer_seals([part, _part("stage2", stage2_seal_s=bad)])
        assert all("stage2_seal_s" not in b for b in part["batches"]), bad
    merge_peer_seals([None, second])  # without stage 1's part there is nothing to join


def test_a_stage_sends_back_exactly_one_part_for_each_stage_after_it():
    back = {**_part("stage2"), "later": [_part("stage3"), _part("stage4")]}
    assert [p["manifest"]["role"] for p in later_parts(back, 2, 4)] == ["stage2", "stage3", "stage4"]
    with pytest.raises(WireError, match="carry 1 later parts; stages 3..4 make 2"):
        later_parts({**back, "later": [_part("stage3")]}, 2, 4)
    with pytest.raises(WireError, match="no list of"):
        later_parts({**back, "later": "stage3"}, 2, 3)
    with pytest.raises(WireError, match="stage 3's RECORDS do not fit"):
        later_parts({**back, "later": [{"manifest": {}}]}, 2, 3)


def test_the_record_merges_the_parts_and_the_writing_endpoint_finishes_it(tmp_path):
    cfg = RunConfig(model="mobilenet_v2", cuts=["features.6"], split_index=6)
    first = {**_part("stage1"), "fidelity": {"fidelity_top1_agreement": 1.0}}
    finished = []
    record = assemble_record("run-1", "complete", None, cfg, [first, _part("stage2")], {"mode": "none"},
                             {"run_wall_s": 1.0, "written_by": "stage1"},
                             lambda rec, parts: finished.append((rec["run_id"], len(parts))))
    assert finished == [("run-1", 2)]  # image batches: the endpoint's finish adds nothing, but is asked
    assert [s["role"] for s in record["manifest"]["stages"]] == ["stage1", "stage2"]
    assert record["summary"]["fidelity_top1_agreement"] == 1.0 and record["config"]["cuts"] == ["features.6"]
    assert write_record(record, None) is None
    path = write_record(record, tmp_path)
    assert path == tmp_path / "run-1.json" and json.loads(path.read_text())["run_id"] == "run-1"
    with pytest.raises(WireError, match="not a safe file name"):
        write_record({**record, "run_id": "../escape"}, tmp_path)
