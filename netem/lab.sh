#!/usr/bin/env bash
# The lab of namespace hosts: a thin face of `paretopipe lab` (see its --help). Root only.
#
# Usage: sudo netem/lab.sh up [--hosts N] | down | status
#   up: N network namespaces on a bridge, each with an eth0, an address and its own key-only sshd;
#       writes a .env for the sweeper into the lab's folder (printed). down: removes all of it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
[ -x "$here/.venv/bin/python" ] && python="$here/.venv/bin/python"
exec "$python" -m paretopipe lab "$@"
