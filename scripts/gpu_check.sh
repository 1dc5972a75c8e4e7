#!/usr/bin/env bash
# The GPU check, run on a GPU machine from this tree's root: the tests marked gpu (tests/gpu) and
# benchmarks/gpu.py, within 8 minutes, on the machine's own python (torch with CUDA), with the
# wheels scripts/gpu_prepare.sh made here installed beside it (no registry is reached). Writes
# OUTDIR/summary.txt (one line, also printed last), the tests' and the benchmark's logs, the
# benchmark's rows, the environment, and the GPU sweep's summary.csv and pareto.csv.
#
# Needs no make, sshd or root-only set-up. On a machine without a GPU (the rehearsal here) the
# tests skip, saying why, and the benchmark measures nothing; the summary says so.
#
#     bash scripts/gpu_check.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/paretopipe-gpu-site}
started=$(date +%s)

if [ -d .gpu-wheels ] && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .gpu-wheels/*.whl > "$OUT/install.log" 2>&1 || { echo "gpu_check: installing .gpu-wheels failed:" \
    "$(tail -3 "$OUT/install.log")" | tee "$OUT/summary.txt"; exit 1; }
  rm -f "$OUT/install.log"  # at most 8 files come back from the machine
else
  echo "gpu_check: no .gpu-wheels here (run scripts/gpu_prepare.sh where pip reaches a registry)" >&2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PARETOPIPE_CACHE_DIR="${PARETOPIPE_CACHE_DIR:-/tmp/paretopipe-gpu-cache}"

{
  echo "host: $(uname -srm), $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" - <<'EOF'
import sys, torch, torchvision, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision "
      f"{torchvision.__version__}, transformers {transformers.__version__}")
print("cuda available:", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
import paretopipe.cli.main, paretopipe.cli.sweep, paretopipe.cli.predict, paretopipe.analysis.report  # noqa: F401
print("paretopipe imports: ok")
EOF
} > "$OUT/env.txt" 2>&1
env_ok=$?
cat "$OUT/env.txt"
if [ $env_ok -ne 0 ]; then
  echo "gpu_check: the environment is not usable: $(tail -1 "$OUT/env.txt")" | tee "$OUT/summary.txt"
  exit 1
fi

GPU_CHECK_OUT="$OUT" timeout 390 "$PY" -m pytest -q -rs -s -p no:cacheprovider -m gpu tests/gpu \
  --junitxml "$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
tests_rc=$?
tail -25 "$OUT/gpu-tests.log"
timeout 100 "$PY" benchmarks/gpu.py --repetitions 10 --json "$OUT/gpu-bench.json" > "$OUT/gpu-bench.log" 2>&1
bench_rc=$?
cat "$OUT/gpu-bench.log"

result=$("$PY" - "$OUT/gpu-tests.xml" "$OUT/gpu-bench.log" <<'EOF'
import re, sys, xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    reasons = {m.get("message", "") for m in suite.iter("skipped")}
    tests = f"{n - f - e - s} passed, {f + e} failed, {s} skipped" + (f" ({'; '.join(sorted(reasons))[:160]})" if s else "")
except (OSError, ET.ParseError) as exc:
    tests = f"no test report ({exc})"
bench = [l for l in open(sys.argv[2]) if l.startswith(("gpu:", "gpu benchmark:"))]
print(f"tests {tests}; benchmark: {' | '.join(b.strip() for b in bench) or 'no result'}")
EOF
)
echo "gpu_check: $result; tests exit $tests_rc, benchmark exit $bench_rc, $(( $(date +%s) - started )) s" \
  | tee "$OUT/summary.txt"
[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
