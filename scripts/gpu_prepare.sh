#!/usr/bin/env bash
# Prepare, here, what a GPU machine needs beyond its own image to run scripts/gpu_check.sh: the
# project's dependencies that the image lacks (or holds too old), as CPython 3.12 manylinux x86-64
# wheels in .gpu-wheels/ (git ignores it), without their own dependencies (each one is named).
#
# The GPU image (python 3.12, torch 2.11, torchvision 0.26, transformers 5.17, numpy, pandas,
# matplotlib, psutil, nvidia-ml-py, scipy, scikit-image, attrs, packaging, narwhals, pyyaml, tqdm,
# filelock, safetensors, tokenizers, huggingface-hub, pytest, pytest-xdist, hypothesis) has the
# rest. The folder and the tree travel together to the machine, 64 MiB at most: this script says
# what the folder weighs.
#
#     bash scripts/gpu_prepare.sh            # then: the device tool's run carries .gpu-wheels
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu-wheels
PY=${PYTHON:-python3}

# Each: a requirement of pyproject.toml the image lacks, or one of their own requirements.
WHEELS=(
  "transformers==5.24.*"         # the project needs 5.24 or later; the image has 5.17
  "adjustText>=1.0"
  "setproctitle>=1.3"
  "python-dotenv>=1.0"
  "paretoset>=1.2"
  "jsonschema>=4.0" "jsonschema-specifications" "referencing" "rpds-py"
  "platformdirs>=3.0"
  "tomli-w>=1.0"
  "zstandard>=0.22"
  "lz4>=4.3"
  "cryptography>=47" "cffi" "pycparser"
  "plotly>=5"
  "websockets>=17"
  "paho-mqtt>=2.0"
  "optuna>=4.9" "alembic" "sqlalchemy" "greenlet" "mako" "colorlog"
)
PLATFORMS=()
for p in manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done

rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d "$DEST" "${WHEELS[@]}"

size=$(du -sb "$DEST" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "gpu_prepare: $(ls "$DEST" | wc -l) wheels, $((size / 1024 / 1024)) MiB, in $DEST; with the tree" \
     "$(((size + tree) / 1024 / 1024)) MiB of the 64 MiB that may travel"
if (( size + tree > 64 * 1024 * 1024 )); then
  echo "gpu_prepare: over 64 MiB: drop a wheel the check does not need" >&2
  exit 1
fi
