"""The GPU stage on a real GPU (``make test-gpu``; ``scripts/gpu_check.sh`` runs these on a GPU
machine). Every test here is marked ``gpu`` and skips, saying why, where torch sees no CUDA device;
``make test`` never runs them.

Tolerances: an image stage on CUDA runs with TF32 off (``torch.backends.cudnn.allow_tf32`` and
``torch.backends.cuda.matmul.allow_tf32`` False), so that float32 on the GPU differs from float32
on the CPU by reassociation only: the largest logit difference must be within 1e-4 of the logits'
own scale (their largest magnitude, at least 1). Where the cut crosses after the last block, the
CUDA stage runs no op of its own and the outputs are bit-equal."""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import time
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, ROOT
from tcp_helpers import run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: torch.cuda.is_available() is false here (scripts/gpu_check.sh runs these on a GPU "
           "machine)")]

#: The relative tolerance of a CUDA stage's float32 outputs against the CPU's (see the docstring).
RELATIVE_TOLERANCE = 1e-4


@pytest.fixture
def exact_float32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("model", ["resnet18", "mobilenetv2"])
def test_a_cuda_stage_2_behind_a_cpu_stage_1_gives_the_unsplit_cpu_models_outputs_at_every_block_cut(
        model, exact_float32):
    from paretopipe.partition.activation import call_stage
    from paretopipe.partition.stages import StageBuilder
    from paretopipe.transport.inputs import synthetic_batch

    cpu, gpu = StageBuilder(model), StageBuilder(model, device="cuda")
    x = synthetic_batch(0, 4, cpu.input_size)
    with torch.no_grad():
        want = cpu.model(x)
    scale = max(1.0, want.abs().max().item())
    worst = {}
    for k in range(cpu.partitioner.num_blocks + 1):
        cuts = cpu.cuts_for(k)
        with torch.no_grad():
            middle = call_stage(cpu.stage(cuts, 0), x)
            moved = tuple(t.cuda() for t in middle) if isinstance(middle, tuple) else middle.cuda()
            got = call_stage(gpu.stage(cuts, 1), moved).cpu()
        if k == cpu.partitioner.num_blocks:
            assert torch.equal(got, want), f"k={k}: the CUDA stage runs nothing, yet the outputs differ"
        worst[k] = (got - want).abs().max().item() / scale
    assert max(worst.values()) <= RELATIVE_TOLERANCE, {k: f"{v:.2e}" for k, v in worst.items()}
    print(f"{model}: largest relative difference over {len(worst)} cuts {max(worst.values()):.2e}")


def test_the_stages_cuda_event_time_agrees_with_the_wall_clock_around_a_synchronised_call_at_batch_8():
    from paretopipe.partition.stages import StageBuilder, StageTimer
    from paretopipe.transport.inputs import synthetic_batch

    builder = StageBuilder("resnet18", device="cuda")
    stage = builder.stage(builder.cuts_for(0), 1)  # the whole model on the GPU
    timer, x = StageTimer("cuda"), synthetic_batch(0, 8, builder.input_size)
    for _ in range(10):
        timer.run(stage, x, "cuda")
    events, walls, copies = [], [], []
    for _ in range(40):
        _, seconds = timer.run(stage, x, "cuda")
        events.append(seconds)
        walls.append(timer.last_wall_s)
        copies.append(timer.last_copy_s)
    event, wall = statistics.median(events), statistics.median(walls)
    print(f"resnet18 batch 8 on CUDA: events {event * 1e3:.3f} ms (copy {statistics.median(copies) * 1e3:.3f} ms), "
          f"wall {wall * 1e3:.3f} ms")
    assert 0 < statistics.median(copies) < event
    assert abs(event - wall) <= 0.10 * wall, (event, wall)


def test_nvml_gives_each_batches_energy_from_the_total_energy_counter_with_idle_subtracted():
    from paretopipe.energy import sampler as energy_sampler
    from paretopipe.energy.sensors import detect
    from paretopipe.partition.stages import StageBuilder
    from paretopipe.transport.inputs import synthetic_batch

    sensors, notes = detect(gpus=[torch.cuda.current_device()])
    nvml = [s for s in sensors if s.name.startswith("nvml:")]
    assert nvml, f"no NVML sensor on a GPU: {notes}"
    assert nvml[0].kind == "energy", "NVML's total-energy counter (Volta and later) was not readable"
    idle = energy_sampler.idle_power(nvml, seconds=2.0, rate_hz=10.0)
    idle_w = idle[nvml[0].name]["total"]
    builder = StageBuilder("resnet18", device="cuda")
    stage = builder.stage(builder.cuts_for(0), 1)
    x = synthetic_batch(0, 32, builder.input_size).cuda()
    batches = 0
    with energy_sampler.EnergySampler(nvml, rate_hz=10.0) as s, torch.no_grad():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:
            stage(x)
            torch.cuda.synchronize()
            batches += 1
        t1 = time.monotonic()
    gross = s.window(t0, t1)[nvml[0].name]["joules"]["total"]
    net = gross - idle_w * (t1 - t0)
    per_batch = net / batches
    share = s.cpu_s / (t1 - t0)
    print(f"NVML: idle {idle_w:.1f} W, busy {gross / (t1 - t0):.1f} W, {per_batch * 1e3:.2f} mJ a batch of 32 "
          f"net of idle ({batches} batches); the 10 Hz sampler's CPU share {share:.2%}")
    assert 0 < idle_w < gross / (t1 - t0) < 1500  # a GPU at work draws more than at rest, and no more than 1.5 kW
    assert per_batch > 0
    assert share < 0.10  # the sampler is not spinning (the figure itself is a measurement: 3.4% on an H100)


@pytest.mark.parametrize("model", ["tiny-lm", "smollm2-135m"])
def test_a_language_model_stage_on_cuda_generates_the_cpu_models_tokens_at_every_cut(model, exact_float32):
    from paretopipe.llm import build, generate
    from paretopipe.llm.stage import LMStage
    from paretopipe.llm.shapes import cuts

    src = build.source(model)
    prompt, gen_tokens = list(range(5, 5 + 12)), 6
    want, want_logits = generate.generate_unsplit(generate.reference_model(src), prompt, gen_tokens)
    for cut in cuts(src.shape):
        k = cut.split
        stages = [LMStage(build.build_stage(src, [k], 0), "cpu"), LMStage(build.build_stage(src, [k], 1), "cuda")]
        got, logits = generate.generate_split(stages, prompt, gen_tokens)
        diff = max((a.cpu() - b).abs().max().item() for a, b in zip(logits, want_logits))
        assert got == want and diff <= 1e-3, (k, got, want, diff)


def test_a_cpu_stage_1_and_a_cuda_stage_2_swept_reported_profiled_and_predicted(tmp_path):
    out = tmp_path / "results"
    sweep = run([PYTHON, "automated_split_tester.py", "--model", "mobilenetv2", "--splits", "all", "--network",
                 "lan,lte", "--stage-devices", "cpu,cuda", "--runs", "1", "--batch-size", "1", "--num-batches", "5",
                 "--warmup", "1", "--threads", "4", "--out", str(out), "--session", "s"], timeout=420)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    session = out / "s"
    rows = list(csv.DictReader((session / "summary.csv").open()))
    splits = {r["split_index"] for r in rows}
    assert {r["network"] for r in rows} == {"lan", "lte"} and len(rows) == 2 * len(splits) > 30
    # the GPU columns: stage 2's CUDA memory, and its energy from NVML
    assert all(float(r["stage2_cuda_peak_bytes"] or 0) > 0 for r in rows if r["split_index"] != max(splits, key=int))
    # stage 2's energy from NVML: net of idle per image, or (its clocks down while it waited on the link)
    # flagged below idle with its gross joules and mean power; never a negative figure
    for r in rows:
        assert float(r["stage2_energy_j"]) > 0 and float(r["stage2_energy_mean_power_w"]) > 0, r
        net = r["stage2_energy_per_image_j"]
        assert (net == "") == (r["stage2_energy_below_idle"] == "True") and (net == "" or float(net) >= 0), r
    assert any(r["stage2_energy_per_image_j"] for r in rows), "no configuration's stage 2 energy was net of idle"
    assert (session / "report" / "pareto.csv").is_file() and (session / "report" / "report.html").is_file()
    profiles = tmp_path / "profiles"
    for device in ("cpu", "cuda"):
        prof = run([PYTHON, "-m", "paretopipe.profile", "--model", "mobilenetv2", "--device", device, "--threads", "4",
                    "--codecs", "float32/none", "--out", str(profiles / f"{device}.json")], timeout=300)
        assert prof.returncode == 0, prof.stderr[-2000:]
    assert json.loads((profiles / "cuda.json").read_text())["device"].startswith("cuda")
    check = run([PYTHON, "-m", "paretopipe.predict", "--model", "mobilenetv2", "--device-profiles",
                 f"{profiles / 'cpu.json'},{profiles / 'cuda.json'}", "--network", "lan,lte", "--validate",
                 str(session)], timeout=300)
    assert check.returncode == 0, check.stderr[-2000:]
    assert re.search(rf"\b{len(rows)} configurations[:,] median \|error\|", check.stdout), check.stdout[-2000:]
    print(check.stdout[-1500:])
    if os.environ.get("GPU_CHECK_OUT"):  # the check script keeps the session's tables
        keep = Path(os.environ["GPU_CHECK_OUT"])
        for name in ("summary.csv", "report/pareto.csv"):
            (keep / name.replace("/", "_")).write_bytes((session / name).read_bytes())
