"""report.html, opened for real in headless Chromium (Debian's package): every configuration is a
drawn point, each network's front a drawn line, the page works offline (plotly.js inside it), and
the screenshot is not blank."""

from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pandas as pd
import pytest

from browser_helpers import CHROMIUM, run_chromium
from paretopipe.analysis import objectives
from paretopipe.analysis.interactive import hover_text
from paretopipe.analysis.report import HTML_FILE, write_report

FIXTURE = Path(__file__).parent / "fixtures" / "results_small"


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_chromium("--virtual-time-budget=8000", *args, timeout=timeout)


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """(width, height, raw RGB(A) rows with filter bytes) of a PNG, read with zlib alone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return width, height, zlib.decompress(idat)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: make test installs Debian's package (sysdeps)")
def test_the_page_renders_every_point_and_front_in_a_real_browser(tmp_path):
    session = tmp_path / "s"
    shutil.copytree(FIXTURE, session)
    out = write_report(session, tmp_path / "report")
    page = out / HTML_FILE
    html = page.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", html) and "<link" not in html  # plotly.js inside: nothing fetched
    configs = pd.read_csv(session / "summary.csv")
    dom = _chromium("--dump-dom", page.as_uri()).stdout
    # plotly draws each scatter point as one SVG path of class "point"; a front is a trace line.
    assert dom.count('<path class="point') == len(configs)
    table = pd.read_csv(out / "pareto.csv")
    fronts = table[table["on_front"]].groupby("network").size()  # the line joins the strict front's points
    assert dom.count('class="js-line"') >= (fronts >= 2).sum() >= 1
    shot = tmp_path / "shot.png"
    _chromium(f"--screenshot={shot}", "--window-size=1100,900", page.as_uri())
    width, height, raw = _png_pixels(shot)
    assert (width, height) == (1100, 900)
    # Filter bytes aside, a blank page would be all 0xff: the plot's points and lines are not.
    non_white = sum(1 for b in raw[::97] if b < 0xC0)
    assert non_white > 200


def test_hover_shows_the_split_the_intervals_the_breakdown_energy_and_memory():
    row = pd.Series({"split_index": 5, "cut": "add_1", "network": "lte", "front_status": "tied",
                     "latency_s": 0.05, "latency_median_ci95_low_s": 0.04, "latency_median_ci95_high_s": 0.06,
                     "throughput_imgs_per_s": 20.0, "stage1_compute_mean_s": 0.01, "transfer_mean_s": 0.03,
                     "energy_modelled_per_image_j": 0.25, "memory_model_bytes": 3 << 20})
    text = hover_text(row, [objectives.LATENCY, objectives.THROUGHPUT])
    assert "<b>k=5</b> (add_1)" in text and "network lte, tied" in text
    assert "latency per batch, median (s): 0.05 [0.04, 0.06]" in text
    assert "stage 1 compute 10.00 ms" in text and "transfer 30.00 ms" in text
    assert "energy/image (modelled): 0.25 J" in text and "3.0 MiB" in text
