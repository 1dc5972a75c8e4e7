#!/usr/bin/env bash
# partition.sh: a 2-stage TCP sweep over split indices on two hosts, over SSH with keys.
#
# Usage: bash partition.sh [--model NAME] [--profile NAME] [--batch-size N] [--num-batches N]
#                          [--warmup N] [--out DIR] [--env-file FILE] [SPLIT ...]
#
# A thin face of the sweeper's remote mode (python -m paretopipe sweep): hosts, keys and paths come
# from .env through the same parser (python-dotenv), read by the sweeper, never by this script.
# PI1_IP runs stage 1 (the data source), PI2_IP or GPU_IP stage 2 (see .env.example). With no SPLIT
# arguments every block split of the model, the 0 and K baselines included, is run. --profile
# applies those network conditions with tc on both hosts (only the data port, so SSH is untouched)
# and clears them afterwards. Results go to a session folder under --out. The exit status is 0 only
# when every split completed; 2 for bad input, 1 for runs that failed.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

args=()
link="--link=none"   # no shaping unless --profile names network conditions
splits=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model|--profile|--batch-size|--num-batches|--warmup|--out|--env-file)
      [ $# -ge 2 ] || { echo "error: $1 needs a value (see --help)" >&2; exit 2; }
      case "$1" in
        --profile) args+=("--network=$2"); link="--link=tc" ;;
        *) args+=("$1=$2") ;;
      esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      case "$1" in
        ''|*[!0-9]*) echo "error: split $1 is not a block index (a whole number; see --help)" >&2; exit 2 ;;
      esac
      splits+=("$1"); shift ;;
  esac
done
if [ ${#splits[@]} -gt 0 ]; then
  args+=("--splits=$(IFS=,; echo "${splits[*]}")")
fi

here=$(cd "$(dirname "$0")" && pwd)
python=${LOCAL_PYTHON:-python3}
[ -x "$here/.venv/bin/python" ] && python="$here/.venv/bin/python"
cd "$here"
exec "$python" -m paretopipe sweep --hosts-required --backend=tcp --runs=1 --no-report --quiet "$link" "${args[@]}"
