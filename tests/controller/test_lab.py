"""The testbed path, proven on a lab of namespace hosts with their own sshd: sweeps over SSH with
real tc for both backends, a 3-stage plan on 3 hosts, preflight catching a host with other code,
deploy, and a remote worker killed mid-sweep. Every lab is gone after its test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from conftest import PYTHON, ROOT
from paretopipe import sshcmd
import tcp_helpers as cli
from lab_helpers import in_host, lab

SLOW = '[slow]\nrate = "20mbit"\ncomment = "rate only: htb shapes it on any kernel"\n'


def _sweep(made, tmp: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    (tmp / "nets.toml").write_text(SLOW)
    return cli.run([PYTHON, "automated_split_tester.py", "--env-file", str(made.env_file), "--model", "resnet18",
                    "--network-file", str(tmp / "nets.toml"), "--runs", "1", "--batch-size", "1",
                    "--num-batches", "4", "--warmup", "1", "--threads", "1", "--drift-every", "0",
                    "--out", str(tmp / "out"), "--session", "s", "--no-report", "--quiet", *args], timeout=timeout)


def _qdisc(made, i: int) -> str:
    return in_host(made, i, "tc", "qdisc", "show", "dev", "eth0").stdout


@pytest.mark.root
@pytest.mark.lab
def test_lab_hosts_take_keys_only_and_the_env_points_at_them(tmp_path):
    from paretopipe.envfile import read_env
    from paretopipe.controller.hosts import Testbed

    with lab("pplk", 2, subnet=52) as made:
        tb = Testbed.from_env(read_env(str(made.env_file)))
        assert [h.address for h in tb.hosts] == made.addresses() and tb.iface == "eth0" and tb.secret
        for host in tb.hosts:
            ok = subprocess.run(host.ssh() + ["cat /proc/self/net/dev | grep -c eth0"], capture_output=True, text=True)
            assert ok.returncode == 0 and ok.stdout.strip() == "1"  # a shell inside that host's namespace
        no_key = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", "-o",
                                 f"UserKnownHostsFile={made.known_hosts}", "--", f"root@{made.address(1)}", "true"],
                                capture_output=True, text=True, timeout=30)
        assert no_key.returncode != 0 and "Permission denied" in no_key.stderr
        for _ in range(3):  # the commands to a host ride one connection, which the lab's down ends
            subprocess.run(tb.hosts[0].ssh() + ["true"], check=True, timeout=30)
        established = subprocess.run(["ss", "-Htn", "state", "established", "dst", made.address(1)],
                                     capture_output=True, text=True).stdout.splitlines()
        assert len(established) == 1, established
        shared = sshcmd.control_path(tb.hosts[0].target, tb.hosts[0].key, tb.hosts[0].ssh_port, tb.hosts[0].known_hosts)
        assert Path(shared).is_socket()
    assert not Path(shared).exists()


@pytest.mark.alone
@pytest.mark.root
@pytest.mark.lab
def test_two_host_sweep_with_tc_shapes_the_data_port_for_real(tmp_path):
    """k = 0 ships the 602 KB input: its transfer is bytes / rate within 10%, at 20 Mbit/s of htb."""
    with lab("pplt", 2, subnet=53) as made:
        proc = _sweep(made, tmp_path, "--splits", "0,9", "--network", "slow", "--link", "tc")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv").set_index("split_index")
        assert set(runs["status"]) == {"complete"} and set(runs["link_mode"]) == {"tc"}
        k0 = runs.loc[0]
        assert k0["transfer_median_s"] == pytest.approx(k0["payload_bytes_mean"] * 8 / 20e6, rel=0.10)
        rec = json.loads((tmp_path / "out" / "s" / k0["json"]).read_text())
        link = rec["manifest"]["link"]
        assert link["host"].endswith(made.address(1)) and {c["rate"] for c in link["classes"]} == {"10Gbit", "20Mbit"}
        assert [m["device"] for m in rec["manifest"]["stages"]] == ["cpu", "cpu"]
        for i in (1, 2):  # cleared after the sweep on both hosts
            assert "htb" not in _qdisc(made, i)


@pytest.mark.alone
@pytest.mark.root
@pytest.mark.lab
def test_a_two_host_sweep_over_mqtt_shapes_the_hops_through_the_broker(tmp_path):
    """The lab's broker runs on host 2 (stage 2's): tc shapes the broker's port, so k = 0's input
    crosses stage 1 -> broker at 20 Mbit/s, and the manifest names the hops shaped and not."""
    from paretopipe.transport.messaging.broker import mosquitto_binary

    if mosquitto_binary() is None:
        pytest.skip("no mosquitto here (make installs it)")
    with lab("pplq", 2, subnet=59, broker=2) as made:
        broker = f"{made.address(2)}:1883"
        assert f"MQTT_BROKER={broker}" in made.env_file.read_text()
        proc = _sweep(made, tmp_path, "--splits", "0,9", "--network", "slow", "--link", "tc", "--transport", "mqtt")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv").set_index("split_index")
        assert set(runs["status"]) == {"complete"} and set(runs["transport"]) == {"mqtt"}
        k0 = runs.loc[0]
        assert k0["transfer_median_s"] == pytest.approx(k0["payload_bytes_mean"] * 8 / 20e6, rel=0.15)
        rec = json.loads((tmp_path / "out" / "s" / k0["json"]).read_text())
        hops = rec["manifest"]["link"]["shaped_hops"]
        assert [(h["port"], h["hops"]) for h in hops] == [
            (1883, [f"stage1 → broker {broker}"]), (1883, [f"broker {broker} → the stages on other hosts"])]
        assert rec["manifest"]["link"]["unshaped_hops"] == ["stage2 ↔ broker (the same host: loopback)"]
        assert {m["transport"]["broker"] for m in rec["manifest"]["stages"]} == {broker}
        for i in (1, 2):
            assert "htb" not in _qdisc(made, i)


@pytest.mark.root
@pytest.mark.lab
def test_three_host_rpc_sweep_of_a_three_stage_plan(tmp_path):
    with lab("pplr", 3, subnet=54) as made:
        proc = _sweep(made, tmp_path, "--backend", "rpc", "--split-blocks", "2,5;4,7", "--network", "slow",
                      "--link", "tc")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv")
        assert sorted(runs["split_index"]) == ["2,5", "4,7"] and set(runs["status"]) == {"complete"}
        for _, row in runs.iterrows():
            rec = json.loads((tmp_path / "out" / "s" / row["json"]).read_text())
            assert rec["manifest"]["rpc"]["stage_ranks"] == [1, 2, 3] and len(rec["manifest"]["stages"]) == 4
            hops = rec["batches"][-1]["hop_bytes"]
            assert len(hops) == 4 and hops[0] == 3 * 224 * 224 * 4 and hops[-1] == 40
            assert rec["config"]["rpc"]["world_size"] == 4 and len(rec["config"]["cuts"]) == 2
        for i in (1, 2, 3):
            assert "htb" not in _qdisc(made, i)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.lab
def test_doctor_catches_a_host_with_other_code_and_deploy_ships_the_tree(tmp_path):
    from paretopipe.controller.doctor import deploy
    from paretopipe.controller.hosts import Testbed

    with lab("ppld", 2, subnet=55) as made:
        env = made.env_file.read_text()
        dirs = [tmp_path / "h1", tmp_path / "h2"]
        tb = Testbed.from_env({**__import__("paretopipe.envfile", fromlist=["read_env"]).read_env(str(made.env_file)),
                               "REMOTE_DIRS": ",".join(map(str, dirs))})
        for host in tb.hosts:
            assert deploy(host, ROOT) == host.remote_python  # the lab's python runs the shipped package
        assert (dirs[0] / "paretopipe" / "network" / "profiles.toml").is_file()
        assert json.loads((dirs[0] / ".paretopipe-deploy.json").read_text())["source_digest"]
        env_file = tmp_path / "lab.env"
        env_file.write_text(env + f"REMOTE_DIRS={dirs[0]},{dirs[1]}\n")
        ok = subprocess.run([PYTHON, "-m", "paretopipe", "doctor", "--env-file", str(env_file), "--model", "resnet18"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.splitlines()[0].split()[:3] == ["host", "ssh", "device"]
        with open(dirs[1] / "paretopipe" / "units.py", "a") as fh:  # host 2 now runs other code
            fh.write("\n# a local change on host 2\n")
        bad = subprocess.run([PYTHON, "-m", "paretopipe", "doctor", "--env-file", str(env_file), "--model", "resnet18"],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert bad.returncode == 1
        errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and made.address(2) in errors[0] and "code digest" in errors[0], bad.stderr
        assert "--deploy" in errors[0]


@pytest.mark.root
@pytest.mark.lab
def test_a_remote_worker_killed_mid_sweep_is_recorded_and_retried(tmp_path):
    with lab("pplw", 2, subnet=56) as made:
        (tmp_path / "nets.toml").write_text(SLOW)
        proc = cli.popen([PYTHON, "automated_split_tester.py", "--env-file", str(made.env_file), "--model",
                          "resnet18", "--network-file", str(tmp_path / "nets.toml"), "--network", "slow",
                          "--splits", "4,6,8", "--runs", "2", "--batch-size", "1", "--num-batches", "4",
                          "--warmup", "1", "--threads", "1", "--out", str(tmp_path / "out"), "--session", "s",
                          "--no-report", "--quiet"])
        runs_dir = tmp_path / "out" / "s" / "runs"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(list(runs_dir.glob("*.json"))) < 2:
            time.sleep(0.2)
        ns2 = subprocess.run(["ip", "netns", "pids", made.namespace(2)], capture_output=True, text=True).stdout.split()
        victims = [p for p in map(int, ns2) if "paretopipe.controller.worker" in " ".join(psutil.Process(p).cmdline())]
        assert victims, "no stage-2 worker in host 2's namespace"
        psutil.Process(victims[0]).kill()
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        failures = pd.read_csv(tmp_path / "out" / "s" / "failures.csv")
        assert len(failures) >= 1 and (failures["attempt"] == 1).all()
        runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv")
        assert len(runs) == 6 and set(runs["status"]) == {"complete"}


def test_make_lab_demo_target_is_wired():
    text = (ROOT / "Makefile").read_text()
    assert "lab-demo:" in text and "paretopipe lab up" in text and "paretopipe doctor" in text
    assert shutil.which("make") is not None


@pytest.mark.alone
@pytest.mark.root
@pytest.mark.lab
def test_a_language_model_sweep_over_ssh_with_tc_pays_its_hidden_state_at_the_links_rate(tmp_path):
    """A language model on the one sweeper over a two-host lab, its link shaped by tc (rate only):
    every configuration complete with its token figures, and a prompt's hidden states cost their
    bytes at the link's rate over its token ids: (TTFT at a hidden state's cut - TTFT at split 0)
    per prompt token is (256 - 8) B at 1 Mbit/s within 25% (a prefill of 256 tokens is 64 KB: a
    burst htb shapes as a link would; a decode step's small frame passes within htb's bucket)."""
    nets = tmp_path / "nets.toml"
    nets.write_text('[thin]\nrate = "1mbit"\ncomment = "rate only: htb shapes it on any kernel"\n')
    with lab("ppll", 2, subnet=60) as made:
        proc = cli.run([PYTHON, "automated_split_tester.py", "--env-file", str(made.env_file), "--model", "tiny-lm",
                        "--splits", "0,1,6", "--network", "thin", "--network-file", str(nets), "--link", "tc",
                        "--prompt-len", "256", "--gen-tokens", "8", "--runs", "1", "--threads", "1",
                        "--drift-every", "0", "--out", str(tmp_path / "out"), "--session", "s", "--no-report",
                        "--quiet"], timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        for table in ("runs.csv", "summary.csv"):
            rows = pd.read_csv(tmp_path / "out" / "s" / table).set_index("split_index")
            assert set(rows["status"]) == {"complete"} and rows["ttft_median_s"].gt(0).all()
            assert rows["tpot_median_s"].gt(0).all() and set(rows["prompt_len"]) == {256}
        runs = pd.read_csv(tmp_path / "out" / "s" / "runs.csv").set_index("split_index")
        assert set(runs["link_mode"]) == {"tc"} and list(runs["bytes_per_token"]) == [8, 256, 256]
        for k in (1, 6):
            per_token = (runs.loc[k, "ttft_median_s"] - runs.loc[0, "ttft_median_s"]) / 256
            assert per_token == pytest.approx((256 - 8) * 8 / 1e6, rel=0.25)
        for i in (1, 2):
            assert "htb" not in _qdisc(made, i)


@pytest.mark.root
@pytest.mark.lab
def test_a_lab_host_with_a_cpu_share_holds_every_process_started_there_over_ssh():
    """--host-cpu: a cgroup around the host's sshd, inherited by every session and what it starts
    (a stage worker, a profile); the other hosts are not held; the lab's down removes the group."""
    from paretopipe.compute import cpushare
    from paretopipe.envfile import read_env
    from paretopipe.controller.hosts import Testbed

    try:
        h = cpushare.Hierarchy.detect()
        cpushare.check_writable(h)
    except Exception as exc:  # noqa: BLE001 - the reason is the skip's
        pytest.skip(f"no writable cgroup cpu controller: {exc}")
    with lab("pplc", 3, subnet=69, cpu=[None, None, 0.25]) as made:
        assert made.cpu == [None, None, 0.25] and len(made.cgroups) == 1
        group = Path(made.cgroups[0])
        quota = (group / ("cpu.cfs_quota_us" if h.version == 1 else "cpu.max")).read_text().split()[0]
        assert int(quota) == cpushare.quota_period_us(0.25)[0]
        tb = Testbed.from_env(read_env(str(made.env_file)))
        held = []
        for host in tb.hosts:  # a session's own process: where its cgroup is
            out = subprocess.run(host.ssh() + ["cat /proc/self/cgroup"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            held.append(group.name in out.stdout)
        assert held == [False, False, True]
    assert not group.exists()


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.lab
def test_which_devices_measured_on_a_three_host_lab_beside_the_prediction(tmp_path):
    """A placement is the hosts a plan runs on, in order: one session over --placements 1-2,1-3-2
    runs the plan 3 on h1 -> h2 and the plan 2,4 on h1 -> h3 -> h2 (host 3 held to a quarter of a
    core, in the middle). Its report says what the third device bought, and predict --subsets
    --validate puts each number of devices' best measured time per token beside the predicted one,
    with both verdicts on the extra device (the figures themselves are benchmarks/device_subsets.py's)."""
    from paretopipe.llm import shapes

    shape, paths = shapes.named("tiny-lm"), []
    for name, speed in (("h1", 1.0), ("h2", 1.0), ("h3", 4.0)):  # one profile per device: two fast, one slow
        blocks = shape.num_blocks
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "kind": "llm-profile", "model": "tiny-lm", "blocks": shapes.block_names(shape),
            "prompt_lens": {"16": {"prefill_s": [0.002 * speed] * blocks, "decode_s": [0.0005 * speed] * blocks}}}))
        paths.append(str(tmp_path / f"{name}.json"))
    with lab("pplv", 3, subnet=70, cpu=[None, None, 0.25]) as made:
        devices = made.env_for([1, 2, 3], tmp_path / "lab.env")  # the lab's own goes with it
        swapped = made.env_for([2, 1, 3], tmp_path / "swapped.env")
        proc = cli.run([PYTHON, "automated_split_tester.py", "--env-file", str(devices), "--model", "tiny-lm",
                        "--split-blocks", "3;2,4", "--placements", "1-2,1-3-2", "--network", "lan", "--link", "emulated",
                        "--prompt-len", "16", "--gen-tokens", "8", "--runs", "1", "--threads", "1", "--drift-every", "0",
                        "--out", str(tmp_path / "out"), "--session", "placed", "--quiet"], timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        addresses = [made.address(i) for i in (1, 2, 3)]
        # A search over the same placements: a pair's plans and a chain's in one space, on the hosts.
        searched = cli.run([PYTHON, "-m", "paretopipe", "search", "--env-file", str(devices), "--model", "tiny-lm",
                            "--splits", "2,3", "--placements", "1-2,1-3-2", "--budget", "2", "--network", "lan",
                            "--link", "emulated", "--prompt-len", "16", "--gen-tokens", "4", "--runs", "1", "--threads",
                            "1", "--drift-every", "0", "--out", str(tmp_path / "out"), "--session", "searched",
                            "--no-report", "--quiet"], timeout=900)
        assert searched.returncode == 0, searched.stderr[-2000:]
    trials = json.loads((tmp_path / "out" / "searched" / "search.json").read_text())["trials"]
    found = pd.read_csv(tmp_path / "out" / "searched" / "summary.csv")
    assert len(trials) == 2 and all(t["status"] == "complete" for t in trials)
    assert {t["config"]["placement"] for t in trials} == {"1-2", "1-3-2"}
    for t in trials:  # each trial ran its plan, of its placement's number of stages, on that placement
        c = t["config"]
        plan = [c["cut1"]] if c["placement"] == "1-2" else sorted([c["cut1"], c["cut2"]])
        row = found[(found["placement"] == c["placement"]) & (found["split_index"].astype(str) == ",".join(map(str, plan)))]
        assert len(row) == 1 and t["values"] == pytest.approx([row["ttft_median_s"].iloc[0], row["tpot_median_s"].iloc[0]])
    assert "3 devices: " in proc.stdout and f"on {addresses[0]} -> {addresses[2]} -> {addresses[1]}, split 2,4" \
        in proc.stdout
    measured = pd.read_csv(tmp_path / "out" / "placed" / "report" / "devices.csv")
    tpot = measured[measured["objective"] == "tpot"].set_index("devices")
    assert tpot.loc[2, "cuts"] == "3" and tpot.loc[3, "placement"] == " -> ".join(addresses[i] for i in (0, 2, 1))
    out = cli.run([PYTHON, "-m", "paretopipe", "predict", "--model", "tiny-lm", "--device-profiles", ",".join(paths),
                   "--network", "lan", "--prompt-len", "16", "--subsets", "--env-file", str(devices),
                   "--validate", str(tmp_path / "out" / "placed"), "--out", str(tmp_path / "pred")], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "measured beside" in out.stdout and "on h1 -> h3 -> h2" in out.stdout
    rows = {(r["objective"], int(r["devices"])): r for r in pd.read_csv(tmp_path / "pred" / "subsets.csv").to_dict("records")}
    assert rows[("tpot", 2)]["measured_placement"] == "h1 -> h2" and rows[("tpot", 2)]["measured_cuts"] == "3"
    assert rows[("tpot", 3)]["measured_placement"] == "h1 -> h3 -> h2" and rows[("tpot", 3)]["measured_cuts"] == "2,4"
    # The same verdict from the session's report and from --validate: both read the same runs.
    assert rows[("tpot", 3)]["measured_gain"] == tpot.loc[3, "gain"]
    assert rows[("tpot", 3)]["agrees"] in (True, False)
    refused = cli.run([PYTHON, "-m", "paretopipe", "predict", "--model", "tiny-lm", "--device-profiles",
                       ",".join(paths), "--subsets", "--env-file", str(swapped), "--validate",
                       str(tmp_path / "out" / "placed")], timeout=120)
    assert refused.returncode == 2 and "every placement begins with the first" in refused.stderr
