"""The report of a folder that partition1.py/partition2.py or distributed_runner.py wrote: every run
is named by its network, also one that named none, and a figure with nothing to draw is left out
with one line that says why, never a crash."""

from __future__ import annotations

import logging
import subprocess

import pandas as pd

from conftest import PYTHON, ROOT
from paretopipe import records
from paretopipe.analysis import plotting
from paretopipe.analysis.report import write_report


def _hand_record(run_id: str, k: int, link: dict, network: str | None, latency: float = 0.05,
                 batches: int = 4) -> dict:
    rows = [{"seq": i, "warmup": False, "start_s": i * latency, "end_s": (i + 1) * latency, "latency_s": latency,
             "payload_bytes": 1000 * (k + 1)} for i in range(batches)]
    return records.build_run_record(
        backend="tcp", run_id=run_id, status="complete", error=None,
        config={"model": "mobilenet_v2", "cuts": [f"c{k}"], "split_index": k, "batch_size": 1, "in_flight": 1,
                "network": network},
        manifest={"stages": [], "link": link}, batches=rows, sysmon={})


def test_a_hand_run_without_a_network_is_labelled_and_reported(tmp_path):
    none = {"mode": "none", "note": "no shaping by this run; the link is whatever the network is"}
    records.atomic_write_json(tmp_path / "a.json", _hand_record("a", 4, none, None))
    records.atomic_write_json(tmp_path / "b.json", _hand_record("b", 10, none, None, latency=0.08))
    records.atomic_write_json(tmp_path / "c.json", _hand_record("c", 4, {"mode": "emulated",
                                                                         "conditions": {"name": "lte"}}, "lte", 0.3))
    proc = subprocess.run([PYTHON, "-m", "paretopipe", "report", str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "consolidated" / "report"
    table = pd.read_csv(out / "pareto.csv")
    assert sorted(table["network"]) == ["lte", "unshaped", "unshaped"]
    assert set(pd.read_csv(tmp_path / "consolidated" / "summary.csv")["network"]) == {"lte", "unshaped"}
    assert (out / "front_mobilenet_v2_tcp_b1.png").is_file() and "unshaped" in (out / "report.html").read_text()
    assert "unshaped" in proc.stdout  # the printed front table


def test_a_figure_with_nothing_to_draw_is_left_out_with_one_line(tmp_path, caplog):
    # A run whose stage 2 died before any batch was measured: complete as a record, nothing to draw.
    records.atomic_write_json(tmp_path / "a.json", _hand_record("a", 4, {"mode": "none"}, None, batches=0))
    with caplog.at_level(logging.WARNING, logger="paretopipe.report"):
        out = write_report(tmp_path)
    lines = [r.getMessage() for r in caplog.records if "not drawn" in r.getMessage()]
    assert any(line.startswith("report: front_mobilenet_v2_tcp_b1.png not drawn: no configuration has a measured")
               for line in lines), lines
    assert not (out / "front_mobilenet_v2_tcp_b1.png").exists() and (out / "pareto.csv").is_file()


def _tick_labels(ax) -> list[str]:
    """The non-empty labels of the x ticks inside the axis's view, major and minor."""
    low, high = ax.get_xlim()
    axis = ax.xaxis
    labels = [fmt(v) for locs, fmt in ((axis.get_majorticklocs(), axis.get_major_formatter()),
                                       (axis.get_minorticklocs(), axis.get_minor_formatter()))
              for v in locs if low <= v <= high]
    return [label for label in labels if label]


def test_a_log_axis_reads_in_plain_numbers_at_1_2_and_5_and_a_short_range_labels_each_tick():
    """A report's latency axis over 27 to 29 ms held none of 10, 20 or 50 and showed no number at
    all; one over decades is labelled at 1, 2 and 5 of each, never in mathtext (2.8x10^1)."""
    plt = plotting.pyplot()
    for low, high in ((27.3, 28.6), (3.0, 400.0)):
        fig, ax = plt.subplots()
        ax.plot([low, high], [1, 2])
        ax.set_xscale("log")
        plotting.plain_log_ticks(ax.xaxis)
        fig.canvas.draw()
        labels = _tick_labels(ax)
        plt.close(fig)
        assert len(labels) >= 3 and not any("$" in label for label in labels), labels
        if high / low < 10:  # each tick, in its own plain number
            assert all(27 <= float(label) <= 29 for label in labels), labels
        else:
            assert {"5", "10", "20", "50", "100", "200"} <= set(labels) <= {"2", "5", "10", "20", "50", "100", "200",
                                                                            "500"}, labels
