"""The link probe's server is bounded: connections and threads are capped, idle clients are dropped,
and running out of file descriptors (EMFILE) pauses it instead of killing it."""

from __future__ import annotations

import pytest

import resource
import socket
import subprocess
import time

from conftest import PYTHON, ROOT
from tcp_helpers import STARTED, free_port


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))


@pytest.mark.slow
def test_serve_survives_a_flood_of_idle_connections_and_emfile():
    port = free_port()
    server = subprocess.Popen([PYTHON, "network_delay.py", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--max-clients", "16"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, preexec_fn=_limit_files, start_new_session=True)
    STARTED.append(server)
    server.stdout.readline()  # listening
    idle = []
    for _ in range(120):  # far beyond both the slots (16) and the descriptors (48)
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    time.sleep(1)
    assert server.poll() is None, server.stderr.read()
    for s in idle:
        s.close()
    time.sleep(6)  # the command deadline (5 s) frees every slot an idle client held
    out = subprocess.run([PYTHON, "network_delay.py", "measure", "--host", "127.0.0.1", "--port", str(port),
                          "--bytes", "200000", "--samples", "5", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert server.poll() is None
    server.kill()
    server.wait(10)
    import json

    assert json.loads(out.stdout)["rtt_samples"] == 5
