"""RPC backend end to end with --local: exact outputs, shared schema, dead worker, bad flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import jsonschema
import numpy as np
import psutil
import pytest
import torch

from conftest import PYTHON, ROOT
from paretopipe import records
from paretopipe.partition import models
from paretopipe.transport import inputs as data
from tcp_helpers import free_port, popen, run, wait_for_line


def _run(tmp, *args, timeout=300):
    return run([PYTHON, "distributed_runner.py", "--local", "--threads", "1", "--metrics-dir", str(tmp), *args],
               timeout=timeout)


@pytest.mark.parametrize("name,world,blocks,pipelined", [
    ("mobilenetv2", 3, "8", False), ("mobilenetv2", 4, "4,12", True),
    ("resnet18", 3, "0", True), ("resnet18", 4, "3,9", False)])
@pytest.mark.slow
def test_local_pipeline_equals_unsplit_model(tmp_path, name, world, blocks, pipelined):
    flag = ["--split-blocks", blocks, "--num-partitions", str(world - 1)]
    out = tmp_path / "o.npz"
    proc = _run(tmp_path, "--world-size", str(world), "--model", name, "--batch-size", "2", "--num-test-samples", "6",
                "--warmup", "1", "--save-outputs", str(out), *flag, *(["--use-pipelining"] if pipelined else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = models.build(name)
    size = models.input_size(name)
    with torch.no_grad():
        ref = torch.stack([model(data.synthetic_batch(i, 2, size)) for i in range(4)])
    assert np.allclose(np.load(out, allow_pickle=False)["logits"], ref.numpy(), atol=1e-5)
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    jsonschema.validate(rec, records.load_schema())
    assert rec["backend"] == "rpc" and rec["status"] == "complete"
    assert rec["config"]["in_flight"] == (4 if pipelined else 1)
    assert len(rec["manifest"]["stages"]) == world  # master + one per stage
    b = [x for x in rec["batches"] if not x["warmup"]][0]
    assert all(f"stage{i}_compute_s" in b for i in range(1, world))
    assert rec["summary"]["throughput_imgs_per_s"] > 0
    # Every stage rank reports its own memory over the run, and its parameters are its share.
    stages = world - 1
    assert sorted(rec["resources"]) == [f"stage{j}" for j in range(1, stages + 1)]
    params = [rec["summary"][f"stage{j}_param_bytes"] for j in range(1, stages + 1)]
    assert sum(params) == sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert all(rec["summary"][f"stage{j}_peak_rss_bytes"] > 0 for j in range(1, stages + 1))


@pytest.mark.slow
def test_killed_worker_gives_clear_error_and_incomplete_json(tmp_path):
    proc = popen([PYTHON, "distributed_runner.py", "--local", "--threads", "1", "--world-size", "3",
                  "--model", "mobilenetv2", "--split-block", "5", "--batch-size", "1",
                  "--num-test-samples", "100000", "--timeout", "20", "--metrics-dir", str(tmp_path),
                  "--rate", "50mbit"])
    master = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    victim = None
    while time.monotonic() < deadline and victim is None:
        for child in master.children():
            # A forked rank's title is one string (setproctitle), a started one's its argv: split both alike.
            args = " ".join(child.cmdline()).split()
            if "--rank" in args and args[args.index("--rank") + 1] == "2":
                victim = child
        time.sleep(0.5)
    assert victim is not None
    # Killed once the master says batches are being measured (its progress line), however long the
    # ranks took to join and build their stages on this machine.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    while (time.monotonic() < deadline + 120 and proc.poll() is None
           and not any("batches measured" in line for line in lines)):
        time.sleep(0.2)
    assert any("batches measured" in line for line in lines), "".join(lines)
    victim.kill()
    t0 = time.monotonic()
    rc = proc.wait(60)
    assert rc == 1 and time.monotonic() - t0 < 30
    reader.join(30)
    err = "".join(lines)
    assert "error: worker rank 2" in err and "exited" in err
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "incomplete" and rec["summary"]["batches_measured"] >= 1
    time.sleep(1)
    assert all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in [victim])
    assert not [c for c in psutil.process_iter(["cmdline"]) if "--master-port" in " ".join(c.info["cmdline"] or [])
                and str(tmp_path) in " ".join(c.info["cmdline"] or [])]


@pytest.mark.slow
def test_the_ranks_of_a_local_master_end_when_it_is_killed(tmp_path):
    """--local forks each rank from the master: killed mid-run, with no chance to stop them, the
    master still takes them with it (the kernel's parent-death signal), as it did its started ranks."""
    proc = popen([PYTHON, "distributed_runner.py", "--local", "--threads", "1", "--world-size", "3",
                  "--model", "mobilenetv2", "--split-block", "5", "--batch-size", "1",
                  "--num-test-samples", "100000", "--metrics-dir", str(tmp_path)])
    wait_for_line(proc, "batches measured", 120)  # every rank joined and serving
    ranks = [c for c in psutil.Process(proc.pid).children() if "--rank" in " ".join(c.cmdline())]
    assert len(ranks) == 2, [c.cmdline() for c in psutil.Process(proc.pid).children()]
    os.kill(proc.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(ranks, timeout=15)
    assert not alive, [c.pid for c in alive]


def test_a_rank_that_never_joins_fails_within_join_timeout_not_timeout(tmp_path):
    """Joining is start-up (a loaded machine starting torch and building the model), bounded by
    --join-timeout; --timeout bounds each result. A master alone waits the former, then one line."""
    t0 = time.monotonic()
    proc = run([PYTHON, "distributed_runner.py", "--rank", "0", "--world-size", "3", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), "--model", "mobilenetv2", "--split-block", "5",
                "--timeout", "1", "--join-timeout", "6", "--metrics-dir", str(tmp_path)], timeout=120)
    waited = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-500:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [errors[0]] and "not all 3 ranks joined at 127.0.0.1" in errors[0] and "within 6s" in errors[0]
    assert "Traceback" not in proc.stderr and waited >= 6
    assert not list(tmp_path.glob("*.json"))  # nothing ran, so no record claims a run


@pytest.mark.parametrize("args,match", [
    (["--world-size", "3", "--num-partitions", "3"], "must be within 1..2 for --world-size 3"),
    (["--world-size", "3", "--split-block", "99"], r"split index 99 out of range for mobilenet_v2: valid 0\.\.19"),
    (["--world-size", "3", "--model", "nope"], "unknown model 'nope'; known:"),
    (["--world-size", "4", "--num-partitions", "3", "--split-blocks", "9,3"], "increasing order"),
])
def test_bad_flags_one_line_errors(tmp_path, args, match):
    proc = _run(tmp_path, *args, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and __import__("re").search(match, lines[0]), proc.stderr[-500:]


@pytest.mark.root
@pytest.mark.slow
def test_the_uv_transport_really_is_tcp_and_auto_is_not(tmp_path):
    """Row 7 of the attack table: --rpc-transport uv must reach TensorPipe. Inside a namespace whose
    loopback is shaped to 20 Mbit/s, uv's TCP pays for the 602 KB input; shared memory does not.

    Not an ``alone`` test: the link's 0.48 s is a floor that a busy machine only raises, and shared
    memory's batch (ResNet-18 on one thread) took 0.05 s alone, 8 times under the 0.4 s between."""
    from lab_helpers import LAB_SKIP

    if LAB_SKIP:
        pytest.skip(LAB_SKIP)
    from paretopipe.network import tc
    from paretopipe.network.conditions import get_conditions

    ns = "pprpc"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        tc.apply(get_conditions(None, rate="20mbit").up, "lo", runner=tc.Runner(netns=ns))
        latency = {}
        for transport in ("uv", "auto"):
            out = tmp_path / transport
            proc = subprocess.run(["ip", "netns", "exec", ns, PYTHON, "distributed_runner.py", "--local", "--threads",
                                   "1", "--world-size", "3", "--model", "resnet18", "--split-block", "0",
                                   "--batch-size", "1", "--num-test-samples", "3", "--warmup", "1",
                                   "--rpc-transport", transport, "--out", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-1500:]
            rec = json.loads(next(out.glob("*.json")).read_text())
            assert rec["manifest"]["rpc"]["transport"].startswith(f"tensorpipe/{transport}")
            latency[transport] = rec["summary"]["latency_median_s"]
        # k = 0: the 602 KB input crosses master -> stage 1 -> stage 2: twice at 20 Mbit/s is 0.48 s.
        assert latency["uv"] > 0.4 > latency["auto"], latency
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
