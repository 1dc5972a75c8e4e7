"""Every bad input gets one line: exit status 2, a single ``error:`` line that names what was wrong and
what is valid, and no traceback. A table of 150+ inputs across every command (flags, .env files,
network-condition files, results folders, weights files), run in-process; a sample also as real
processes through the anchor's scripts."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, ROOT

GUIDANCE = re.compile(r"valid|must|give|use |add |expected|accepted|choose from|one of|at least|see --help|needs? |"
                      r"known|write|set |is not|not a|out of range|a whole number|a positive|run it|install|"
                      r"does not|cannot|no such|not found|refused|save one|are required|only|a folder|a file|"
                      r"names no|for example|e\.g\.", re.IGNORECASE)


def _files(tmp: Path) -> dict[str, str]:
    """Bad files of every kind the commands read."""
    (tmp / "nets").mkdir()
    for name, text in {"unknown-key.toml": '[x]\nbandwidth = "1mbit"\n', "mbps.toml": '[x]\nrate = "1mbps"\n',
                       "notoml.toml": "[x\n", "flat.toml": "x = 1\n", "dist.toml": '[x]\njitter = "1ms"\ndistribution = "gamma"\n',
                       "neg.toml": '[x]\ndelay = "-5ms"\n', "loss.toml": '[x]\nloss = "140%"\n',
                       "binary.toml": "\udcff"}.items():
        (tmp / "nets" / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    torch.save({1: torch.zeros(1)}, tmp / "intkeys.pth")
    torch.save([1, 2, 3], tmp / "list.pth")
    (tmp / "garbage.pth").write_bytes(b"not a torch file at all" * 10)
    torch.save({"features.0.weight": torch.zeros(1)}, tmp / "wrongshape.pth")
    (tmp / "empty-session").mkdir()
    (tmp / "empty-session" / "runs.csv").write_text("")
    (tmp / "empty-session" / "summary.csv").write_text("")
    (tmp / "nocols").mkdir()
    (tmp / "nocols" / "runs.csv").write_text("a,b\n1,2\n")
    (tmp / "nocols" / "summary.csv").write_text("a,b\n1,2\n")
    (tmp / "afile").write_text("x")
    (tmp / "badprofile.json").write_text('{"schema": "something else"}')
    (tmp / "notjson.json").write_text("{{{")
    envs = {"port.env": "PI1_IP=10.0.0.1\nPI2_IP=10.0.0.2\nPORT=99999\n",
            "sshport.env": "HOSTS=10.0.0.1,10.0.0.2\nSSH_PORT=abc\n",
            "user.env": "HOSTS=10.0.0.1,10.0.0.2\nSSH_USER=-oProxyCommand=touch\n",
            "host.env": "HOSTS=10.0.0.1,-oProxyCommand=x\n",
            "onehost.env": "PI1_IP=10.0.0.1\n",
            "device.env": "HOSTS=10.0.0.1,10.0.0.2\nDEVICES=cpu,tpu\n",
            "master.env": "MASTER_PORT=abc\n",
            "secret.env": "PARETOPIPE_SECRET=short\n",
            "keyed.env": "PARETOPIPE_SECRET=bad-inputs-secret-0123456789abcdef\n",
            "badhost.env": "HOSTS=10.0.0.1,bad host name\n"}
    for name, text in envs.items():
        (tmp / name).write_text(text)
    return {"tmp": str(tmp)}


def cases() -> list[tuple[str, list[str], str]]:
    """(id, argv for the paretopipe command, what the error line must name)."""
    T = "{tmp}"
    c: list[tuple[str, list[str], str]] = []
    add = lambda i, argv, what: c.append((i, argv, what))  # noqa: E731
    # split
    for bad, what in (("nope", "unknown model 'nope'"), ("", "unknown model ''"), ("../../etc/passwd", "unknown model")):
        add(f"split-model-{bad or 'empty'}", ["split", "--model", bad, "--list"], what)
    add("split-classes", ["split", "--model", "resnet18", "--num-classes", "x"], "--num-classes")
    add("split-no-model", ["split", "--list"], "--model")
    add("split-unknown-flag", ["split", "--model", "resnet18", "--bogus"], "--bogus")
    # stage 1 and stage 2 (partition1.py, partition2.py)
    for cmd in ("stage1", "stage2"):
        for flag, value, what in (("--port", "0", "out of range"), ("--port", "70000", "out of range"),
                                  ("--port", "-1", "out of range"), ("--port", "http", "'http' is not"),
                                  ("--threads", "-1", "--threads"), ("--threads", "0", "--threads"),
                                  ("--num-classes", "-3", "--num-classes"), ("--timeout", "0", "--timeout"),
                                  ("--timeout", "nan", "--timeout"), ("--timeout", "inf", "--timeout"),
                                  ("--connect-timeout", "-5", "--connect-timeout"), ("--max-payload", "0", "--max-payload"),
                                  ("--split", "-2", "--split"), ("--split", "two", "--split")):
            add(f"{cmd}{flag}={value}", [cmd, "--model", "resnet18", flag, value], flag if flag != "--port" else what)
        add(f"{cmd}-model", [cmd, "--model", "nope", "--split", "1"], "unknown model 'nope'")
        add(f"{cmd}-split-range", [cmd, "--model", "resnet18", "--split", "99"], "split index 99 out of range")
        add(f"{cmd}-cut", [cmd, "--model", "resnet18", "--cut", "nope"], "unknown cut 'nope'")
        add(f"{cmd}-device", [cmd, "--model", "resnet18", "--split", "2", "--device", "tpu"], "unknown device 'tpu'")
        add(f"{cmd}-cuda", [cmd, "--model", "resnet18", "--split", "2", "--device", "cuda"], "CUDA is not available")
        add(f"{cmd}-weights-int-keys", [cmd, "--model", "resnet18", "--split", "2", "--weights", f"{T}/intkeys.pth"],
            "is not a state dict")
        add(f"{cmd}-weights-list", [cmd, "--model", "resnet18", "--split", "2", "--weights", f"{T}/list.pth"],
            "does not hold a state dict")
        add(f"{cmd}-weights-garbage", [cmd, "--model", "resnet18", "--split", "2", "--weights", f"{T}/garbage.pth"],
            "cannot load weights")
        add(f"{cmd}-weights-missing", [cmd, "--model", "resnet18", "--split", "2", "--weights", f"{T}/none.pth"],
            "weights file not found")
        add(f"{cmd}-weights-folder", [cmd, "--model", "resnet18", "--split", "2", "--weights", T], "is a folder")
        add(f"{cmd}-weights-shape", [cmd, "--model", "alexnet", "--split", "2", "--weights", f"{T}/wrongshape.pth"],
            "do not fit the model")
        add(f"{cmd}-secret", [cmd, "--model", "resnet18", "--split", "2", "--env-file", f"{T}/secret.env"],
            "PARETOPIPE_SECRET has 5 characters")
        add(f"{cmd}-env-folder", [cmd, "--model", "resnet18", "--split", "2", "--env-file", T], "is not a file")
    for flag, value in (("--batch-size", "0"), ("--num-batches", "-1"), ("--warmup", "-1"), ("--in-flight", "0"),
                        ("--seed", "-1"), ("--compression", "gzip"), ("--wire-dtype", "int3"),
                        ("--compression-level", "0"), ("--link", "pigeon")):
        add(f"stage1{flag}={value}", ["stage1", "--model", "resnet18", "--split", "2", flag, value], flag)
    add("stage1-zero-batches", ["stage1", "--model", "resnet18", "--split", "2", "--num-batches", "0", "--warmup", "0"],
        "at least one batch")
    add("stage1-dataset", ["stage1", "--model", "resnet18", "--split", "2", "--dataset", "imagenet"], "unknown dataset")
    # Trained weights as their ecosystems name them (nothing is fetched: the tests run offline)
    add("stage1-weights-name", ["stage1", "--model", "resnet18", "--split", "2", "--weights", "IMAGENET9K"],
        "not a weight name of resnet18; valid: DEFAULT, IMAGENET1K_V1")
    add("split-hub-id-offline", ["split", "--model-dir", "nobody/no-such-model", "--list"],
        "not in the Hugging Face cache")
    add("split-gguf-missing", ["split", "--model-dir", f"{T}/none.gguf", "--list"], "none.gguf: no such file")
    add("stage1-chat-no-prompt", ["stage1", "--model", "tiny-lm", "--split", "2", "--chat"],
        "--chat applies the model's chat template to --prompt TEXT; give one")
    # the adaptive split
    adaptive = ["stage1", "--model", "resnet18", "--split", "adaptive"]
    for i, extra, what in (("cut", ["--cut", "x"], "exclude each other"),
                           ("in-flight", ["--in-flight", "2"], "one batch in flight"),
                           ("candidates", ["--candidates", "99"], "split index 99 out of range"),
                           ("profiles", ["--device-profiles", "a.json"], "give two profiles"),
                           ("objective", ["--objective", "speed"], "--objective"),
                           ("deadline", ["--deadline-ms", "0"], "--deadline-ms")):
        add(f"stage1-adaptive-{i}", adaptive + extra, what)
    # A static split may have a deadline (its driver then serves late batches locally), with one batch in flight.
    add("stage1-deadline-in-flight", ["stage1", "--model", "resnet18", "--split", "2", "--deadline-ms", "100",
                                      "--in-flight", "2"], "a deadline settles each batch before the next")
    # A generation takes a deadline with one stream (its steps are settled one at a time), never under LoadGen.
    add("stage1-lm-deadline-streams", ["stage1", "--model", "tiny-lm", "--split", "2", "--deadline-ms", "100",
                                       "--streams", "2"], "--deadline-ms with --streams 2")
    add("sweep-lm-fault-streams", ["sweep", "--model", "tiny-lm", "--local", "--splits", "2", "--fault",
                                   "stage2:kill@2+1", "--streams", "2", "--dry-run"], "use --streams 1")
    add("stage1-candidates-static", ["stage1", "--model", "resnet18", "--split", "2", "--candidates", "1,2"],
        "applies to --split adaptive or sciot only")
    add("stage1-candidates-unknown-cut", adaptive + ["--candidates", "2,no+such"], "is not a cut of resnet18")
    add("sweep-adaptive-rpc", ["sweep", "--model", "resnet18", "--local", "--splits", "2,adaptive", "--backend", "rpc",
                               "--dry-run"], "TCP backend")
    add("sweep-adaptive-in-flight", ["sweep", "--model", "resnet18", "--local", "--splits", "adaptive",
                                     "--in-flight", "2", "--dry-run"], "one batch in flight")
    for i, extra in (("rpc", ["--backend", "rpc"]), ("in-flight", ["--in-flight", "2"])):
        add(f"sweep-deadline-{i}", ["sweep", "--model", "resnet18", "--local", "--splits", "2", "--deadline-ms", "500",
                                    "--dry-run", *extra], "--deadline-ms settles each TCP batch before the next")
    for value, what in (("moon", "unknown network 'moon'"), ("lan,lte", "one named condition, not a list")):
        add(f"stage1-network-{value}", ["stage1", "--model", "resnet18", "--split", "2", "--network", value], what)
    for flag, value, what in (("--rate", "10mbps", "bytes per second"), ("--rate", "fast", "bad rate"),
                              ("--rate=", "-1mbit", "bad rate"), ("--delay", "5 parsecs", "bad duration"),
                              ("--loss", "120%", "within 0..100"), ("--jitter", "x", "bad duration"),
                              ("--distribution", "gamma", "distribution 'gamma'")):
        given = [flag + value] if flag.endswith("=") else [flag, value]  # a value starting with '-' needs '='
        add(f"stage1{flag.rstrip('=')}={value}", ["stage1", "--model", "resnet18", "--split", "2", *given,
                                                  *(["--jitter", "1ms"] if flag == "--distribution" else [])], what)
    for name, what in (("unknown-key", "unknown key 'bandwidth'"), ("mbps", "bytes per second"),
                       ("notoml", "not valid TOML"), ("flat", "is not a table"), ("dist", "distribution 'gamma'"),
                       ("neg", "bad duration"), ("loss", "within 0..100"), ("binary", "not valid TOML")):
        add(f"stage1-file-{name}", ["stage1", "--model", "resnet18", "--split", "2", "--network", "x",
                                    "--network-file", f"{T}/nets/{name}.toml"], what)
        add(f"sweep-file-{name}", ["sweep", "--model", "resnet18", "--network", "x", "--network-file",
                                   f"{T}/nets/{name}.toml", "--local", "--dry-run"], what)
    add("stage1-file-missing", ["stage1", "--model", "resnet18", "--split", "2", "--network", "x", "--network-file",
                                f"{T}/nope.toml"], "not found")
    add("stage1-file-folder", ["stage1", "--model", "resnet18", "--split", "2", "--network", "x", "--network-file", T],
        "is a folder")
    # sweep (automated_split_tester.py)
    sweep = ["sweep", "--model", "resnet18", "--local"]
    for flag, value, what in (("--splits", "5-2", "low-high"), ("--splits", "x-y", "bad --splits"),
                              ("--splits", "99", "split index 99 out of range"), ("--splits", ",", "names no split"),
                              ("--splits", "-3", "bad --splits"), ("--num-batches", "0", "--num-batches"),
                              ("--num-batches", "-1", "--num-batches"), ("--runs", "0", "--runs"),
                              ("--batch-size", "0", "--batch-size"), ("--in-flight", "0", "--in-flight"),
                              ("--warmup", "-1", "--warmup"), ("--wait-time", "0", "--wait-time"),
                              ("--timeout", "-1", "--timeout"), ("--threads", "-1", "--threads"),
                              ("--backend", "udp", "--backend"), ("--link", "carrier", "--link"),
                              ("--network", "moon", "unknown network 'moon'"),
                              ("--stage-cpu", "2,abc", "is not a number"), ("--stage-cpu", "0.5", "one share per stage"),
                              ("--stage-cpu", "999,1", "out of range"), ("--stage-threads", "1", "one positive integer"),
                              ("--stage-threads", "0,1", "one positive integer"),
                              ("--stage-devices", "cpu,tpu", "tpu"), ("--stage-devices", "cuda,cpu", "CUDA is not available"),
                              ("--stage-devices", "cpu,cpu,cpu", "one device per stage"),
                              ("--split-blocks", "9,3", "increasing"), ("--split-blocks", "a,b", "bad --split-blocks"),
                              ("--split-blocks", "2,5;3", "same number of stages"), ("--split-blocks", ";", "names no plan"),
                              ("--out", "{tmp}/afile", "is a file"), ("--session", "../x", "a folder name"),
                              ("--rpc-source", "moon", "--rpc-source"), ("--num-classes", "0", "--num-classes"),
                              ("--models", ",", "names no model"), ("--model", "nope", "unknown model 'nope'"),
                              ("--compression", "gzip", "--compression"), ("--wire-dtype", "int3", "--wire-dtype")):
        argv = sweep + [flag, value] + ["--dry-run"] * (flag not in ("--out",))
        if flag in ("--model", "--models"):
            argv = ["sweep", flag, value, "--local", "--dry-run"]
        add(f"sweep{flag}={value}", argv, what.replace("{tmp}", T))
    # A TCP chain runs in a sweep; on one machine its hops are shaped by the emulated link, not tc.
    add("sweep-tcp-chain-tc", sweep + ["--split-blocks", "2,5", "--link", "tc", "--iface", "lo", "--dry-run"],
        "a TCP chain (--split-blocks) on this machine shapes its hops with the emulated link")
    # --encrypt: a cipher needs the shared secret; the rpc backend cannot be sealed
    keyed = ["sweep", "--model", "resnet18", "--env-file", f"{T}/keyed.env", "--local", "--dry-run"]
    for i, argv, what in (("no-secret", sweep + ["--encrypt", "none,aesgcm", "--dry-run"],
                           "--encrypt aesgcm needs PARETOPIPE_SECRET"),
                          ("unknown", keyed + ["--encrypt", "rot13"], "--encrypt 'rot13': valid choices are none, auto"),
                          ("empty", keyed + ["--encrypt", ","], "--encrypt ',' names no cipher"),
                          ("rpc", keyed + ["--encrypt", "chacha20", "--backend", "rpc"], "use --backend tcp")):
        add(f"sweep-encrypt-{i}", argv, what)
    for cmd in ("stage1", "stage2"):
        add(f"{cmd}-encrypt-no-secret", [cmd, "--model", "resnet18", "--split", "2", "--encrypt", "auto",
                                         "--env-file", f"{T}/none.env"], "--encrypt auto needs PARETOPIPE_SECRET")
    add("sweep-resume-none", sweep + ["--resume", "--out", f"{T}/no-results"], "no session found")
    add("sweep-cpu-trace-rpc", sweep + ["--stage-cpu-trace", "stage1=pi4-throttle", "--backend", "rpc"],
        "TCP backend's stage workers")
    add("sweep-backend-list", sweep + ["--backend", "tcp,grpc"], "'grpc' is not one of tcp, rpc, both")
    add("sweep-tc-no-iface", sweep + ["--link", "tc", "--dry-run"], "needs IFACE")
    for env, what in (("port", "PORT='99999'"), ("sshport", "SSH_PORT='abc'"), ("user", "is not a user name"),
                      ("host", "is not a host name"), ("onehost", "one host"), ("device", "'tpu'"),
                      ("badhost", "is not a host name"), ("secret", "PARETOPIPE_SECRET")):
        add(f"sweep-env-{env}", ["sweep", "--model", "resnet18", "--env-file", f"{T}/{env}.env", "--dry-run"], what)
    add("sweep-env-folder", ["sweep", "--model", "resnet18", "--env-file", T, "--dry-run"], "is not a file")
    add("sweep-hosts-required", ["sweep", "--model", "resnet18", "--hosts-required", "--env-file", f"{T}/none.env"],
        "set PI1_IP and PI2_IP")
    # report
    for argv, what in ((["report", f"{T}/nothing"], "no sweep results"), (["report", f"{T}/afile"], "is a file"),
                       (["report", f"{T}/empty-session"], "is empty: no run of"),
                       (["report", f"{T}/nocols"], "lacks the column"),
                       (["report", str(ROOT / "tests/analysis/fixtures/results_small"), "--out", f"{T}/afile"], "is a file"),
                       (["report", str(ROOT / "tests/analysis/fixtures/results_small"), "--format", "gif"], "--format"),
                       (["report"], "results")):
        add(f"report-{len(c)}", argv, what)
    # predict
    pred = ["predict", "--model", "mobilenetv2"]
    for argv, what in ((pred + ["--device-profiles", f"{T}/nope.json,{T}/nope.json"], "device profile not found"),
                       (pred + ["--device-profiles", f"{T}/badprofile.json,{T}/badprofile.json"], "not a ParetoPipe device profile"),
                       (pred + ["--device-profiles", f"{T}/notjson.json,{T}/notjson.json"], "not readable JSON"),
                       (pred + ["--device-profiles", f"{T}/nope.json"], "at least 2 device profiles"),
                       (pred + ["--device-profiles", ","], "at least 2 device profiles"),
                       (pred + ["--device-profiles", "+,+"], "empty device profile name"),
                       (pred + ["--device-profiles", "a,b", "--batch-size", "0"], "--batch-size"),
                       (pred + ["--device-profiles", "a,b", "--wire-dtype", "int3"], "--wire-dtype"),
                       (pred + ["--device-profiles", "a,b", "--wire-dtype", "auto"], "--wire-dtype auto is chosen per cut"),
                       (pred + ["--device-profiles", "a,b", "--sweep-points", "x"], "--sweep-points"),
                       (["predict", "--device-profiles", "a,b"], "--model")):
        add(f"predict-{len(c)}", argv, what)
    # profile
    prof = ["profile", "--model", "alexnet", "--out", f"{T}/p.json"]
    for argv, what in ((prof + ["--batch-sizes", "1,x"], "--batch-sizes"), (prof + ["--cpus", "abc"], "--cpus"),
                       (prof + ["--cpus", "99"], "--cpus"), (prof + ["--threads", "0"], "--threads"),
                       (prof + ["--cpu-share", "99"], "out of range"), (prof + ["--weights", f"{T}/intkeys.pth"],
                                                                        "is not a state dict"),
                       (prof + ["--device", "tpu"], "unknown device"), (["profile", "--model", "alexnet"], "--out"),
                       (prof + ["--repetitions", "0"], "--repetitions"), (prof + ["--warmup", "-1"], "--warmup")):
        add(f"profile-{len(c)}", argv, what)
    # netem (network_delay.py)
    for argv, what in ((["netem", "apply", "--dev", "eth0", "--dry-run"], "give --network NAME"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "10mbps", "--dry-run"], "bytes per second"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "1mbit", "--port", "0", "--dry-run"], "--port"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "1mbit", "--port", "99999", "--dry-run"], "--port"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "1mbit", "--duration", "-5"], "--duration"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "1mbit", "--duration", "0"], "--duration"),
                       (["netem", "apply", "--dev", "eth0", "--network", "moon", "--dry-run"], "unknown network 'moon'"),
                       (["netem", "apply", "--rate", "1mbit"], "--dev"),
                       (["netem", "measure", "--host", "127.0.0.1", "--samples", "0"], "--samples"),
                       (["netem", "measure", "--host", "127.0.0.1", "--bytes", "-1"], "--bytes"),
                       (["netem", "measure", "--host", "127.0.0.1", "--port", "70000"], "--port"),
                       (["netem", "serve", "--port", "-1"], "--port"),
                       (["netem", "serve", "--max-clients", "0"], "--max-clients"),
                       (["netem", "apply", "--dev", "eth0", "--rate", "1mbit", "--ssh=-oProxyCommand=x", "--sudo"],
                        "is not a host name"),
                       (["netem", "dance"], "invalid choice"), (["netem"], "required")):
        add(f"netem-{len(c)}", argv, what)
    # rpc (distributed_runner.py)
    rpc = ["rpc", "--model", "resnet18"]
    for argv, what in ((rpc + ["--world-size", "1"], "--world-size 1"), (rpc + ["--world-size", "0"], "--world-size"),
                       (rpc + ["--num-partitions", "5"], "--num-partitions 5 must be within"),
                       (rpc + ["--rank", "7"], "--rank 7 must be within"), (rpc + ["--rank", "-1"], "--rank"),
                       (rpc + ["--master-port", "0"], "--master-port"), (rpc + ["--batch-size", "0"], "--batch-size"),
                       (rpc + ["--in-flight", "0"], "--in-flight"), (rpc + ["--rpc-transport", "shm"], "--rpc-transport"),
                       (rpc + ["--env-file", f"{T}/master.env"], "MASTER_PORT='abc'"),
                       (rpc + ["--timeout", "0"], "--timeout"), (rpc + ["--num-test-samples", "0"], "--num-test-samples")):
        add(f"rpc-{len(c)}", argv, what)
    # search
    search = ["search", "--model", "mobilenetv2", "--local"]
    for argv, what in ((search + ["--budget", "3", "--stages", "1"], "--stages 1: a split needs at least 2 stages"),
                       (search, "--budget"), (search + ["--budget", "0"], "--budget"),
                       (search + ["--budget", "3", "--sampler", "annealing"], "invalid choice: 'annealing'"),
                       (search + ["--budget", "3", "--splits", "adaptive"], "the search space is empty"),
                       (search + ["--budget", "3", "--device-profiles", f"{T}/none.json"],
                        "give one profile per stage (2), got 1"),
                       (search + ["--budget", "3", "--study", "redis://127.0.0.1/0"],
                        "unknown storage 'redis'; give journal:PATH"),
                       (search + ["--budget", "3", "--study", f"journal:{T}/no-folder/s.journal"], "does not exist"),
                       (search + ["--budget", "3", "--study-grace-s", "0"], "--study-grace-s"),
                       (search + ["--budget", "3", "--vary", "codec=float8/none"], "valid wire dtypes: float32"),
                       (search + ["--budget", "3", "--vary", "threads=1,2"], "NAME one of codec, batch_size, in_flight"),
                       (search + ["--budget", "3", "--vary", "batch_size=1,0"], "'0' is not a batch size"),
                       (search + ["--budget", "3", "--vary", "codec=float16/none", "--vary", "codec=float32/none"],
                        "--vary codec given twice"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--search", "0"], "--budget/--search"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--backend", "both", "--wire-dtype", "float16"],
                        "--wire-dtype float16 with the rpc backend"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--backend", "rpc", "--compression", "zstd"],
                        "--compression zstd with the rpc backend"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--wire-dtype", "auto"],
                        "--wire-dtype auto needs --fidelity-target"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--fidelity-target", "1.5"], "--fidelity-target"),
                       (["sweep", "--model", "mobilenetv2", "--local", "--search", "2", "--sampler", "x"],
                        "invalid choice: 'x'")):
        add(f"search-{len(c)}", argv, what)
    # MLPerf LoadGen scenarios (stage 1, the RPC master, the sweep)
    for argv, what in ((["stage1", "--scenario", "offline", "--mlperf-compliant", "--min-duration-s", "5"],
                        "--min-duration-s 5 is below the edge rules' 600 s"),
                       (["stage1", "--scenario", "server", "--mlperf-compliant", "--min-query-count", "10"],
                        "below the edge rules' 270336 queries"),
                       (["stage1", "--scenario", "burst"], "invalid choice: 'burst'"),
                       (["stage1", "--min-duration-s", "3"], "--min-duration-s applies to a LoadGen run"),
                       (["stage1", "--mlperf-compliant"], "--mlperf-compliant applies to a LoadGen run"),
                       (["stage1", "--scenario", "server", "--latency-bound-ms", "0"], "--latency-bound-ms"),
                       (["stage1", "--scenario", "offline", "--loadgen-mode", "accuracy", "--split", "3"],
                        "accuracy needs labelled inputs"),
                       (["stage1", "--scenario", "singlestream", "--save-outputs", f"{T}/o.npz"],
                        "--save-outputs with --scenario"),
                       (["stage1", "--scenario", "singlestream", "--split", "adaptive"], "keeps a static split"),
                       (["rpc", "--local", "--scenario", "offline", "--mlperf-compliant", "--min-duration-s", "5"],
                        "below the edge rules' 600 s"),
                       (["sweep", "--local", "--scenario", "closed,bursty"], "'bursty' is not one of closed, singlestream"),
                       (["sweep", "--local", "--scenario", "server", "--mlperf-compliant", "--min-duration-s", "60"],
                        "below the edge rules' 600 s"),
                       (["sweep", "--local", "--server-qps", "3"], "--server-qps applies to a LoadGen run"),
                       (["report", f"{T}/empty-session", "--predictions", f"{T}/afile"], "--predictions"),
                       (["sweep", "--local", "--scenario", "offline", "--splits", "0,adaptive"],
                        "drop adaptive from --splits")):
        add(f"loadgen-{len(c)}", argv, what)
    # engines (paretopipe.engines): unknown, one per stage of the wrong length, where they cannot run
    sweep = ["sweep", "--model", "mobilenetv2", "--local"]
    for argv, what in ((sweep + ["--engine", "tensorrt"], "unknown engine 'tensorrt'; valid: torch, onnxruntime"),
                       (sweep + ["--stage-engines", "onnxruntime"], "give one engine per stage (2)"),
                       (sweep + ["--stage-engines", "onnxruntime,torch,torch"], "give one engine per stage (2)"),
                       (sweep + ["--stage-engines", "onnxruntime,torch", "--engine", "openvino"], "not both"),
                       (sweep + ["--engine", "onnxruntime", "--backend", "rpc"], "the rpc backend's ranks run torch"),
                       (sweep + ["--engine", "llamacpp"], "runs a language model given as a GGUF"),
                       # refused before any run, not in every run's failure (each workload's refusals)
                       (sweep + ["--eval-text", f"{T}/afile"], "--eval-text is a language model's evaluation text"),
                       (["sweep", "--model", "tiny-lm", "--local", "--engine", "onnxruntime"],
                        "a language model's stages run on torch"),
                       (["stage1", "--engine", "llamacpp"], "invalid choice: 'llamacpp'"),
                       (["profile", "--model", "mobilenetv2", "--engine", "tflite", "--out", f"{T}/p.json"],
                        "invalid choice: 'tflite'")):
        add(f"engine-{len(c)}", argv, what)
    # lab, doctor and the umbrella itself
    for argv, what in ((["lab", "up", "--hosts", "1"], "valid 2..8 hosts"), (["lab", "up", "--hosts", "99"], "2..8"),
                       (["lab", "up", "--name", "Bad-Name"], "lab name 'Bad-Name'"), (["lab", "up", "--subnet", "300"], "--subnet"),
                       (["lab", "up", "--arch", "sparc"], "--arch 'sparc': valid are native, aarch64"),
                       (["lab", "up", "--hosts", "2", "--arch", "aarch64,native,native"], "at most one per host"),
                       (["lab", "up", "--hosts", "2", "--broker", "3"], "--broker 3: name one of the lab's hosts, 1..2"),
                       (["lab", "explode"], "invalid choice"), (["doctor", "--env-file", f"{T}/none.env"], "no hosts to check"),
                       (["doctor", "--env-file", f"{T}/onehost.env"], "one host"),
                       (["doctor", "--env-file", f"{T}/user.env"], "is not a user name"),
                       (["frobnicate"], "unknown command 'frobnicate'")):
        add(f"misc-{len(c)}", argv, what)
    return c


CASES = cases()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("ident, argv, what", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(files, ident, argv, what, capsys, monkeypatch):
    from paretopipe.cli.common import run_cli
    from paretopipe.cli.main import main

    for key in ("PI1_IP", "PI2_IP", "GPU_IP", "HOSTS", "PARETOPIPE_SECRET", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    argv = [a.replace("{tmp}", files["tmp"]) for a in argv]
    what = what.replace("{tmp}", files["tmp"])
    try:
        code = run_cli(main, argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.strip() and " WARNING " not in line]
    assert code == 2, (argv, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert what in lines[0], (what, lines[0])
    assert GUIDANCE.search(lines[0]), f"the line does not say what is valid: {lines[0]}"
    assert "Traceback" not in err


@pytest.mark.parametrize("script, args, what", [
    ("partition1.py", ["--port", "70000"], "out of range"),
    ("partition2.py", ["--threads", "-1"], "--threads"),
    ("automated_split_tester.py", ["--splits", "5-2", "--local", "--dry-run"], "low-high"),
    ("network_delay.py", ["apply", "--dev", "eth0", "--duration", "-5"], "--duration"),
    ("distributed_runner.py", ["--world-size", "1"], "--world-size"),
])
@pytest.mark.slow
def test_the_anchor_scripts_give_the_same_one_line(script, args, what):
    env = {k: v for k, v in os.environ.items() if k not in ("PI1_IP", "PI2_IP", "GPU_IP", "HOSTS")}
    proc = subprocess.run([PYTHON, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and what in proc.stderr, proc.stderr
    assert json.dumps(proc.stderr).count("Traceback") == 0
