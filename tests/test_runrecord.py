"""A run record read back as its type (paretopipe/runrecord.py): the same JSON out as came in, and
every malformed key refused by name."""

from __future__ import annotations

import json

import pytest

from paretopipe import records, runrecord
from paretopipe.errors import UsageError


def _record() -> dict:
    batches = [{"seq": i, "warmup": False, "start_s": i * 0.1, "end_s": i * 0.1 + 0.05, "latency_s": 0.05,
                "stage1_compute_s": 0.01, "stage2_compute_s": 0.02} for i in range(4)]
    return records.build_run_record(backend="tcp", run_id="r1", status="complete", error=None,
                                     config={"model": "m", "batch_size": 2}, manifest={"link": {"mode": "emulated"}},
                                     batches=batches, sysmon={}, resources=None)


def test_a_run_record_reads_back_as_its_type_and_writes_the_same_json():
    raw = json.loads(json.dumps(_record()))  # as it arrives in a worker's done event
    rec = runrecord.RunRecord.of(raw)
    assert rec.to_dict() == raw and list(rec.to_dict()) == list(raw)
    assert (rec.status, rec.backend, rec.summary.batches_measured) == ("complete", "tcp", 4)
    assert rec.summary.stages("compute_median_s") == [0.01, 0.02] and rec.summary.stage(2, "compute_median_s") == 0.02
    assert rec.summary["latency_median_s"] == rec.summary.latency_median_s == pytest.approx(0.05)
    assert rec.summary.measuring_s == pytest.approx(0.35) and dict(rec.summary) == raw["summary"]


@pytest.mark.parametrize("change,match", [
    (lambda r: r.pop("run_id"), "missing key 'run_id'"),
    (lambda r: r.update(status="done"), r"status: 'done'; valid: complete, infeasible, incomplete"),
    (lambda r: r.update(extra=1), "unknown key 'extra'"),
    (lambda r: r.update(schema_version="2"), "schema_version: expected an integer"),
    (lambda r: r["summary"].update(latency_median_s={"a": 1}), "is not a number, a flag, a short text or null"),
    (lambda r: r["summary"].update({"x" * 200: 1.0}), "is not a figure's name"),
    (lambda r: r["summary"].pop("throughput_imgs_per_s"), "missing 'throughput_imgs_per_s'"),
    (lambda r: r["summary"].update(batches_measured=4.0), "batches_measured: expected an integer"),
    (lambda r: r.update(batches={"0": {}}), "batches: expected a list"),
    (lambda r: r.update(summary=[1]), "summary: expected an object"),
])
def test_a_malformed_record_is_refused_by_name(change, match):
    raw = json.loads(json.dumps(_record()))
    change(raw)
    with pytest.raises(UsageError, match=match):
        runrecord.RunRecord.of(raw, "stage 1's record")
