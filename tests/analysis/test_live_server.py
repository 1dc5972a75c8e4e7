"""The live page of a session (paretopipe watch, sweep --live): /api/session against summary.csv,
the token off loopback, a port in use, a hostile request, and the page in real headless Chromium
following a real sweep, a new configuration on it within 2 s of its run's record being written."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from browser_helpers import CHROMIUM, Browser
from paretopipe.analysis.live_server import WatchServer
from paretopipe.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "results_small"
TOKEN = "a-token-long-enough-1234"


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _serving(session: Path, **kw) -> WatchServer:
    server = WatchServer(session, port=0, **kw)
    server.start_thread()
    return server


def test_api_session_holds_one_configuration_per_row_of_summary_csv(tmp_path):
    session = tmp_path / "s"
    shutil.copytree(FIXTURE, session)
    server = _serving(session)
    try:
        status, body = _get(f"http://127.0.0.1:{server.server_address[1]}/api/session")
        page_status, page = _get(f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.close()
    assert status == 200 and page_status == 200
    state = json.loads(body)
    summary = pd.read_csv(session / "summary.csv")
    assert state["configurations_source"] == "summary.csv" and len(state["configurations"]) == len(summary)
    for row, conf in zip(summary.to_dict("records"), state["configurations"]):
        for col in ("model", "network", "runs", "latency_median_s", "throughput_imgs_per_s"):
            assert conf[col] == pytest.approx(row[col]) if isinstance(row[col], float) else conf[col] == row[col]
    # Each network's front: no configuration on it is beaten on both objectives by another of its network.
    for net, grp in summary.assign(on_front=[c["on_front"] for c in state["configurations"]]).groupby("network"):
        front = grp[grp["on_front"]]
        assert not front.empty
        for _, f in front.iterrows():
            assert not ((grp["latency_median_s"] < f["latency_median_s"])
                        & (grp["throughput_imgs_per_s"] > f["throughput_imgs_per_s"])).any(), net
    # The page brings everything it runs: no script, style or font from elsewhere.
    assert b"<script src" not in page and b"http://" not in page.replace(b"http://www.w3.org/2000/svg", b"")
    assert state["progress"]["runs_done"] == 0 and state["current_run"] is None


def test_off_loopback_the_page_needs_its_token(tmp_path):
    with pytest.raises(UsageError, match="give --token"):
        WatchServer(tmp_path, host="0.0.0.0", port=0)
    with pytest.raises(UsageError, match="at least 16"):
        WatchServer(tmp_path, host="0.0.0.0", port=0, token="short")
    server = _serving(tmp_path, host="0.0.0.0", token=TOKEN)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(f"{base}/api/session")[0] == 403
        assert _get(f"{base}/api/session?token=not-the-token-at-all")[0] == 403
        assert _get(f"{base}/api/session?token={TOKEN}")[0] == 200
        assert _get(f"{base}/api/session", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert _get(f"{base}/?token={TOKEN}")[0] == 200
    finally:
        server.close()


def test_a_hostile_request_is_answered_and_the_page_keeps_serving(tmp_path):
    server = _serving(tmp_path)
    port = server.server_address[1]
    try:
        for junk in (b"\x00\xff garbage\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
                     b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", b"POST /api/session HTTP/1.1\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(junk)
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
            # Refused with a status (a request without a version gets the body alone, as HTTP/0.9).
            assert re.search(rb"(HTTP/1\.[01] |Error code: )(400|404|414|501)", reply), reply[:300]
        status, body = _get(f"http://127.0.0.1:{port}/api/session")
        assert status == 200 and json.loads(body)["configurations"] == []
    finally:
        server.close()


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_in_use_is_one_line_and_exit_2_for_watch_and_for_a_sweep_before_it_starts(tmp_path):
    with _busy_port() as busy:
        port = str(busy.getsockname()[1])
        watch = subprocess.run([sys.executable, "-m", "paretopipe", "watch", str(FIXTURE), "--port", port],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
        sweep = subprocess.run([sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "4",
                                "--live", port, "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
    for done in (watch, sweep):
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            f"error: port {port} on 127.0.0.1 is in use; give another with --port (or --live PORT), or 0 for any "
            f"free one"], done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    off = subprocess.run([sys.executable, "-m", "paretopipe", "watch", str(FIXTURE), "--host", "0.0.0.0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert off.returncode == 2 and len(off.stderr.strip().splitlines()) == 1 and "give --token" in off.stderr


# -- the page in a real browser, following a real sweep -------------------------------------------
ROW_KEYS = "Array.from(document.querySelectorAll('#configurations tbody tr')).map(r => r.dataset.key)"


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: make test installs Debian's package (sysdeps)")
def test_the_page_in_chromium_shows_each_new_configuration_within_2_s_of_its_run_being_written(tmp_path):
    out = tmp_path / "out"
    sweep = subprocess.Popen([sys.executable, "automated_split_tester.py", "--model", "mobilenetv2", "--splits",
                              "4,8,12,16", "--runs", "1", "--batch-size", "1", "--num-batches", "30",
                              "--order", "sequential", "--drift-every", "0", "--live", "0", "--out", str(out),
                              "--session", "s", "--no-report"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    url = None
    while url is None:
        line = sweep.stderr.readline()
        assert line, "the sweep ended before it served its page"
        if line.startswith("live page: "):
            url = line.split(": ", 1)[1].strip()
    drain = threading.Thread(target=sweep.stderr.read, daemon=True)
    drain.start()
    browser = Browser()
    delays = {}
    try:
        browser.open(url)
        runs = out / "s" / "runs"
        seen_files: set[str] = set()
        deadline = time.monotonic() + 600
        while sweep.poll() is None and time.monotonic() < deadline:
            new = [p for p in runs.glob("*.json")] if runs.is_dir() else []
            for path in new:
                if path.name in seen_files:
                    continue
                seen_files.add(path.name)
                written = path.stat().st_mtime
                split = json.loads(path.read_text())["config"]["split_index"]
                key = f"mobilenet_v2/tcp/lan/{split}"
                while time.monotonic() < deadline:
                    if key in (browser.eval(ROW_KEYS) or []):
                        delays[split] = time.time() - written
                        break
                    if sweep.poll() is not None:
                        break  # the sweep ended and took its page with it
                    time.sleep(0.05)
            time.sleep(0.05)
        progress = browser.eval("document.getElementById('progress-text').textContent")
    finally:
        browser.close()
    assert sweep.wait(120) == 0
    # Every run written while the page was up appeared on it, each within 2 s of its record.
    print(f"page delays after each record (s): {delays}")
    assert len(delays) >= 3, delays
    assert all(d < 2.0 for d in delays.values()), delays
    assert "of 4 runs" in progress
    # Afterwards the same session served by `paretopipe watch` matches the summary.csv it wrote.
    server = _serving(out / "s")
    try:
        state = json.loads(_get(f"http://127.0.0.1:{server.server_address[1]}/api/session")[1])
    finally:
        server.close()
    summary = pd.read_csv(out / "s" / "summary.csv")
    assert state["configurations_source"] == "summary.csv" and state["complete"]
    assert [c["split_index"] for c in state["configurations"]] == list(summary["split_index"])
    assert [c["latency_median_s"] for c in state["configurations"]] == pytest.approx(list(summary["latency_median_s"]))
    assert state["progress"]["runs_done"] == 4 and state["progress"]["planned_runs"] == 4
