#!/usr/bin/env bash
# partition.sh: a 2-stage TCP sweep over split indices on two hosts, over SSH with keys.
#
# Usage: bash partition.sh [--model NAME] [--profile NAME] [--batch-size N] [--num-batches N]
#                          [--warmup N] [--out DIR] [--env-file FILE] [SPLIT ...]
#
# Hosts and paths come from .env (see .env.example): PI1_IP (stage 1, the data source),
# PI2_IP or GPU_IP (stage 2), SSH_USER, SSH_KEY, SSH_PORT (22), REMOTE_DIR, REMOTE_PYTHON,
# PORT (5555), IFACE (for --profile). With no SPLIT arguments every block split of the model,
# including the 0 and K baselines, is run. For each split it starts partition1.py on PI1 and
# partition2.py on PI2 (stage 2 connects when stage 1 is ready: readiness is the handshake, not
# a sleep), waits for both, and copies the run JSON into --out. --profile applies that network
# profile with tc on both hosts (only on PORT, so SSH is untouched) and clears it afterwards.
# On exit, error or Ctrl-C it stops what it started, by PID, and clears any profile it applied.
set -euo pipefail

MODEL=mobilenetv2
PROFILE=""
BATCH=8
NUM_BATCHES=20
WARMUP=3
OUT=results/partition_sh
ENV_FILE=.env
SPLITS=()

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --batch-size) BATCH=$2; shift 2 ;;
    --num-batches) NUM_BATCHES=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --env-file) ENV_FILE=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) SPLITS+=("$1"); shift ;;
  esac
done

# Read KEY=VALUE lines from .env without executing it.
if [ -f "$ENV_FILE" ]; then
  while IFS='=' read -r key value; do
    case "$key" in
      ''|\#*) continue ;;
      PI1_IP|PI2_IP|GPU_IP|SSH_USER|SSH_KEY|SSH_PORT|SSH_KNOWN_HOSTS|REMOTE_DIR|REMOTE_PYTHON|PORT|IFACE)
        value=${value%\"}; value=${value#\"}
        if [ -z "${!key:-}" ]; then export "$key=$value"; fi ;;
    esac
  done < "$ENV_FILE"
fi
STAGE1_HOST=${PI1_IP:-}
STAGE2_HOST=${PI2_IP:-${GPU_IP:-}}
if [ -z "$STAGE1_HOST" ] || [ -z "$STAGE2_HOST" ]; then
  echo "error: set PI1_IP and PI2_IP (or GPU_IP) in $ENV_FILE or the environment (see .env.example)" >&2
  exit 2
fi
SSH_USER=${SSH_USER:-$(id -un)}
REMOTE_DIR=${REMOTE_DIR:-~/paretopipe}
REMOTE_PYTHON=${REMOTE_PYTHON:-python3}
PORT=${PORT:-5555}
OPTS=(-o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=10)
[ -n "${SSH_KEY:-}" ] && OPTS+=(-i "$SSH_KEY")
[ -n "${SSH_KNOWN_HOSTS:-}" ] && OPTS+=(-o "UserKnownHostsFile=$SSH_KNOWN_HOSTS")
SSH_OPTS=("${OPTS[@]}" -p "${SSH_PORT:-22}")
LOCAL_PYTHON=${LOCAL_PYTHON:-python3}
[ -x .venv/bin/python ] && LOCAL_PYTHON=.venv/bin/python

# The remote command line is built here on purpose, every value quoted with %q.
# shellcheck disable=SC2029
remote() { local host=$1; shift; ssh "${SSH_OPTS[@]}" "$SSH_USER@$host" "$@"; }
quote() { printf '%q ' "$@"; }

SESSION=$(date -u +%Y%m%dT%H%M%SZ)
REMOTE_OUT="$REMOTE_DIR/results/partition_sh/$SESSION"
STARTED=()      # "host pid" pairs we started
APPLIED=()      # hosts we applied a profile on

stop_started() {
  local entry
  for entry in "${STARTED[@]+"${STARTED[@]}"}"; do
    remote "${entry% *}" "kill -TERM ${entry#* } 2>/dev/null; sleep 1; kill -KILL ${entry#* } 2>/dev/null; true" || true
  done
  STARTED=()
}

cleanup() {
  local host
  stop_started
  for host in "${APPLIED[@]+"${APPLIED[@]}"}"; do
    remote "$host" "cd $(quote "$REMOTE_DIR") && $REMOTE_PYTHON network_delay.py clear --dev $(quote "$IFACE")" >/dev/null 2>&1 || true
  done
  APPLIED=()
}
trap cleanup EXIT
trap 'echo "interrupted: stopping remote stages" >&2; exit 130' INT TERM

# start HOST LOGFILE ARGS... : start a stage in the background there; prints its PID.
start() {
  local host=$1 log=$2; shift 2
  remote "$host" "cd $(quote "$REMOTE_DIR") && mkdir -p $(quote "$REMOTE_OUT") && { nohup $REMOTE_PYTHON $(quote "$@") >$(quote "$log") 2>&1 </dev/null & echo \$!; }"
}

# wait_pid HOST PID SECONDS: poll until the process is gone; returns 1 on timeout.
wait_pid() {
  local host=$1 pid=$2 limit=$3 waited=0
  while remote "$host" "kill -0 $pid 2>/dev/null"; do
    sleep 1; waited=$((waited + 1))
    [ "$waited" -ge "$limit" ] && return 1
  done
  return 0
}

if [ ${#SPLITS[@]} -eq 0 ]; then
  K=$("$LOCAL_PYTHON" -c "from paretopipe.split import partitioner_for; print(partitioner_for('$MODEL')[1].num_blocks)")
  for ((k = 0; k <= K; k++)); do SPLITS+=("$k"); done
fi

if [ -n "$PROFILE" ]; then
  [ -n "${IFACE:-}" ] || { echo "error: --profile needs IFACE in $ENV_FILE" >&2; exit 2; }
  for host in "$STAGE1_HOST" "$STAGE2_HOST"; do
    APPLIED+=("$host")
    remote "$host" "cd $(quote "$REMOTE_DIR") && $REMOTE_PYTHON network_delay.py apply --profile $(quote "$PROFILE") --dev $(quote "$IFACE") --port $PORT" >/dev/null
  done
fi

mkdir -p "$OUT"
echo "partition.sh: $MODEL, splits ${SPLITS[*]}, $STAGE1_HOST -> $STAGE2_HOST, results in $OUT"
failed=0
for k in "${SPLITS[@]}"; do
  common=(--model-name "$MODEL" --split-index "$k" --port "$PORT" --batch-size "$BATCH" --connect-timeout 120 --quiet)
  pid1=$(start "$STAGE1_HOST" "$REMOTE_OUT/stage1_k$k.log" partition1.py "${common[@]}" --host 0.0.0.0 \
         --num-batches "$NUM_BATCHES" --warmup "$WARMUP" ${PROFILE:+--network-delay-ms 0})
  STARTED+=("$STAGE1_HOST $pid1")
  pid2=$(start "$STAGE2_HOST" "$REMOTE_OUT/stage2_k$k.log" partition2.py "${common[@]}" --host "$STAGE1_HOST" \
         --output-dir "$REMOTE_OUT")
  STARTED+=("$STAGE2_HOST $pid2")
  if wait_pid "$STAGE2_HOST" "$pid2" 900 && wait_pid "$STAGE1_HOST" "$pid1" 60; then
    echo "k=$k done"
  else
    echo "k=$k timed out" >&2; failed=$((failed + 1))
  fi
  stop_started  # both have exited already unless they timed out
done

# Fetch over the same SSH channel (tar works with any sshd; scp needs its sftp subsystem).
remote "$STAGE2_HOST" "cd $(quote "$REMOTE_OUT") && tar cf - ./*.json" | tar xf - -C "$OUT" \
  || { echo "error: no run JSON to fetch from $STAGE2_HOST:$REMOTE_OUT" >&2; exit 1; }
echo "fetched $(find "$OUT" -name '*.json' | wc -l) run JSONs into $OUT ($failed failed)"
[ "$failed" -eq 0 ]
