"""One real LoadGen test over a stand-in SUT, for the tests of what is read from LoadGen's logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from paretopipe.loadgen.settings import LoadgenOptions, make_test_settings


def run_loadgen(tmp: Path, opts: LoadgenOptions, issue: Callable[[Any], None], *, expected_latency_s: float,
                expected_qps: float, server_qps: float) -> Path:
    """Run LoadGen with ``opts`` over a SUT whose IssueQuery is ``issue`` (8 samples in its
    library), its logs written into ``tmp``; returns ``tmp``."""
    import mlperf_loadgen as lg

    tmp.mkdir(parents=True, exist_ok=True)
    settings = make_test_settings(opts, expected_latency_s=expected_latency_s, expected_qps=expected_qps,
                                  server_qps=server_qps)
    log = lg.LogSettings()
    log.log_output.outdir, log.log_output.copy_summary_to_stdout, log.enable_trace = str(tmp), False, False
    sut, qsl = lg.ConstructSUT(issue, lambda: None), lg.ConstructQSL(8, 8, lambda i: None, lambda i: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    return tmp
