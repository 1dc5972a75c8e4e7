"""The TCP backend's messages (transport.tcp.messages): every field a peer sends is checked before
anything uses it, and a value out of its range is a WireError that names it."""

from __future__ import annotations

import pytest
import torch

from paretopipe.errors import WireError
from paretopipe.transport import wire
from paretopipe.transport.tcp.messages import (MAX_SEGMENTS, RunStart, check_part, json_payload, json_tensor, message,
                                               read_result_meta, read_segment_times, result_meta_fields,
                                               safe_run_id)


def test_a_run_start_is_read_field_by_field_and_a_wrong_or_unknown_field_is_a_wire_error():
    start = message(RunStart, {"run_id": "r1", "config": {"model": "m"}, "link": {}, "stage": 1}, "RUN")
    assert isinstance(start, RunStart) and start.run_id == "r1" and start.stage == 1
    with pytest.raises(WireError, match="run_id"):
        message(RunStart, {"run_id": 7, "config": {}, "link": {}}, "RUN")
    with pytest.raises(WireError, match="missing key 'link'"):
        message(RunStart, {"run_id": "r1", "config": {}}, "RUN")
    with pytest.raises(WireError, match="unknown key 'extra'"):
        message(RunStart, {"run_id": "r1", "config": {}, "link": {}, "extra": 1}, "RUN")


@pytest.mark.parametrize("run_id", ["../etc/passwd", "a/b", "", ".hidden", "x" * 161, "a..b", 5, None])
def test_a_run_id_that_could_name_a_path_is_refused(run_id):
    with pytest.raises(WireError, match="not a safe file name"):
        safe_run_id(run_id)


def test_a_plain_run_id_is_its_own_file_name():
    assert safe_run_id("20261130-lan-k3_r0.v1") == "20261130-lan-k3_r0.v1"


def test_a_records_part_must_fit_its_schema():
    part = {"manifest": {"role": "stage2"}, "sysmon": {"cpu": 1.0}, "batches": [{"seq": 0, "warmup": False}]}
    assert check_part(part, "stage 2", True) is part
    with pytest.raises(WireError, match="stage 2's RECORDS do not fit the schema"):
        check_part({"manifest": {}, "sysmon": {}}, "stage 2", True)  # batches are required of the last stage
    with pytest.raises(WireError, match="stage 3's RECORDS"):
        check_part({**part, "batches": [{"seq": -1, "warmup": False}]}, "stage 3", True)
    with pytest.raises(WireError):
        check_part({**part, "generation": {"exactness": {"token_agreement": 2.0}}}, "stage 2", True)


def test_each_later_stages_durations_and_a_middle_stages_bytes_are_read_and_checked():
    meta = {**{k: 0.5 for k in result_meta_fields(2) + result_meta_fields(3)}, "stage2_wire_bytes": 4096}
    read = read_result_meta(meta, 3, sealed=False)
    assert read["stage3_compute_s"] == 0.5 and read["stage2_wire_bytes"] == 4096
    assert "stage3_wire_bytes" not in read  # the last stage sends nothing on
    for bad, match in (({"stage2_compute_s": -1.0}, "not a duration"), ({"stage2_decode_s": True}, "not a duration"),
                       ({"stage2_wire_bytes": 2 ** 48}, "not a byte count"), ({"stage2_wire_bytes": 1.5}, "byte count")):
        with pytest.raises(WireError, match=match):
            read_result_meta({**meta, **bad}, 3, sealed=False)
    with pytest.raises(WireError, match="stage2_open_s"):  # sealed: the open time is a duration too
        read_result_meta({**meta, "stage2_open_s": "slow"}, 3, sealed=True)


def test_segment_times_must_fit_the_runs_segments():
    assert read_segment_times({}, 10) == (0, [])
    assert read_segment_times({"stage2_segment_first": 3, "stage2_segment_s": [0.1, 0.2]}, 10) == (3, [0.1, 0.2])
    for first, times, segments in ((9, [0.1, 0.2], 10), (-1, [0.1], 10), (True, [0.1], 10), (0, None, 10),
                                   (0, [0.1] * (MAX_SEGMENTS + 1), MAX_SEGMENTS + 2)):
        with pytest.raises(WireError, match="do not fit"):
            read_segment_times({"stage2_segment_first": first, "stage2_segment_s": times}, segments)
    with pytest.raises(WireError, match="empty value"):
        read_segment_times({"stage2_segment_first": 0, "stage2_segment_s": [None]}, 10)


def test_json_crosses_as_a_uint8_payload_and_anything_else_is_refused():
    obj = {"later": [{"manifest": {"role": "stage3"}}], "n": 3}
    frame = wire.Frame(wire.RECORDS, 0, json_tensor(obj), None)
    assert json_payload(frame) == obj
    with pytest.raises(WireError, match="uint8 JSON payload"):
        json_payload(wire.Frame(wire.RECORDS, 0, torch.zeros(3), None))
