#!/usr/bin/env bash
# An aarch64 Python with torch on this x86 machine: qemu-user in a debootstrap sysroot, cached
# outside the repository (ARM_CACHE, default /var/cache/paretopipe-arm; about 1 GB). Needs root.
#
#   bash scripts/arm_sysroot.sh setup          build what is missing, or was left unfinished (about 7
#                                              minutes cold)
#   bash scripts/arm_sysroot.sh state          what setup would find: complete, missing or interrupted
#   bash scripts/arm_sysroot.sh fingerprints   print the zoo's default-weights fingerprints as JSON
#   bash scripts/arm_sysroot.sh python ARGS    run the sysroot's python3 (this checkout at /opt/paretopipe)
#   bash scripts/arm_sysroot.sh venv           install this checkout as a Pi user would: a wheel built
#                                              here, pip-installed into /opt/venv in the sysroot, and
#                                              print the host-side python wrapper a lab host runs
#   bash scripts/arm_sysroot.sh sources DIR    copy what that wheel is built from into DIR
#
# QEMU_CPU is a Pi's core (cortex-a72 by default; cortex-a76 for a Pi 5): qemu's default "max"
# CPU (512-bit SVE) computes F.linear wrongly. PyPI's aarch64 torch 2.14 wheels are CUDA builds
# whose CUDA libraries do not resolve here; torch 2.9.1 is PyPI's CPU build for aarch64, and the
# default weights do not depend on the torch version (they are drawn by numpy's PCG64).
set -euo pipefail
CACHE=${ARM_CACHE:-/var/cache/paretopipe-arm}
ROOTFS=$CACHE/rootfs
# torch and torchvision live in the sysroot (/opt/site), so a chroot needs no bind mount for them
SITE=$ROOTFS/opt/site
WHEELS=$ROOTFS/opt/wheels
VENV=/opt/venv
WRAPPER=$CACHE/bin/python3-aarch64
QEMU_CPU=${QEMU_CPU:-cortex-a72}
# pip's target for aarch64 wheels: CPython 3.11 (bookworm's) on any manylinux a Pi's glibc runs
PLAT=(--only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux2014_aarch64)
for v in 17 28 34 35 36; do PLAT+=(--platform "manylinux_2_${v}_aarch64"); done
HERE=$(cd "$(dirname "$0")/.." && pwd)
PIP=${PIP:-$HERE/.venv/bin/pip}

# A step that can be interrupted (debootstrap, pip's install of torch into the site) writes its
# marker only when it has finished; a step found without its marker is done again from scratch.
# A rootfs from before the markers counts as whole when debootstrap finished it: the second stage
# removes /debootstrap as its last act.
ROOTFS_DONE=$ROOTFS/.paretopipe-rootfs-complete
SITE_DONE=$SITE/.paretopipe-site-complete

# "complete", "missing" or "interrupted": what setup finds of the rootfs (and then does).
rootfs_state() {
  if [ -f "$ROOTFS_DONE" ]; then echo complete
  elif [ ! -e "$ROOTFS" ]; then echo missing
  elif [ -x "$ROOTFS/usr/bin/python3" ] && [ ! -e "$ROOTFS/debootstrap" ]; then
    touch "$ROOTFS_DONE"; echo complete
  else echo interrupted
  fi
}

# A site from before the marker is whole when torch, numpy and pillow are all there.
site_state() {
  if [ -f "$SITE_DONE" ]; then echo complete
  elif [ ! -e "$SITE/torch" ]; then echo missing
  elif [ -f "$SITE/torch/version.py" ] && [ -d "$SITE/numpy" ] && [ -d "$SITE/PIL" ]; then
    touch "$SITE_DONE"; echo complete
  else echo interrupted
  fi
}

# Nothing of an interrupted rootfs is kept: what is mounted inside it is unmounted first.
discard_rootfs() {
  echo "arm_sysroot: $ROOTFS was left unfinished (interrupted); building it again" >&2
  grep -o " $ROOTFS/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$ROOTFS"
}

setup() {
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq qemu-user-static binfmt-support debootstrap >/dev/null
  fi
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  case "$(rootfs_state)" in
    interrupted) discard_rootfs ;&
    missing)
      mkdir -p "$ROOTFS"
      debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,python3-venv,python3-pip,iproute2 \
        bookworm "$ROOTFS" >&2
      chroot "$ROOTFS" /debootstrap/debootstrap --second-stage >&2
      touch "$ROOTFS_DONE" ;;
  esac
  if [ ! -x "$ROOTFS/usr/sbin/tc" ]; then  # a Pi has tc; sysroots made before it was included lack it
    chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive QEMU_CPU="$QEMU_CPU" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends iproute2' >&2
  fi
  # PyPI has no aarch64 wheel of MLCommons LoadGen: a Pi user builds it from its source, with g++
  # and Python's headers (install_venv does, offline, from the sdist fetched here)
  if [ ! -x "$ROOTFS/usr/bin/g++" ] || ! ls "$ROOTFS"/usr/include/python3*/Python.h >/dev/null 2>&1; then
    chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive QEMU_CPU="$QEMU_CPU" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ python3-dev' >&2
  fi
  if [ -d "$CACHE/site/torch" ] && [ ! -d "$SITE/torch" ]; then  # a cache made before the site moved
    mkdir -p "$(dirname "$SITE")" && mv "$CACHE/site" "$SITE"
  fi
  if [ "$(site_state)" != complete ]; then
    rm -rf "$SITE"
    "$PIP" install -q "${PLAT[@]}" --target "$SITE" --no-deps torch==2.9.1 torchvision==0.24.1 >&2
    "$PIP" install -q "${PLAT[@]}" --target "$SITE" --upgrade numpy typing_extensions sympy networkx jinja2 fsspec \
      filelock platformdirs pillow >&2
    touch "$SITE_DONE"
  fi
}

run_python() {
  mkdir -p "$ROOTFS/opt/paretopipe"
  mountpoint -q "$ROOTFS/opt/paretopipe" || mount --bind -o ro "$HERE" "$ROOTFS/opt/paretopipe"
  trap 'umount "$ROOTFS/opt/paretopipe" 2>/dev/null || true' EXIT
  chroot "$ROOTFS" /usr/bin/env QEMU_CPU="$QEMU_CPU" PYTHONPATH=/opt/site:/opt/paretopipe HOME=/tmp \
    OMP_NUM_THREADS=1 python3 "$@" 2> >(grep -v -e NNPACK -e cpuinfo >&2)
}

# What the wheel is built from, copied into $1 (pyproject.toml, README.md and paretopipe/, without
# bytecode). Files are named one by one, never a directory: the tests write __pycache__ folders into
# paretopipe/ meanwhile, and tar fails a copy when a directory it reads changes under it ("file
# changed as we read it", exit 1), which ended a CI run.
copy_wheel_sources() {
  (cd "$HERE" && find pyproject.toml README.md paretopipe -name __pycache__ -prune -o -type f -print0) \
    | tar -C "$HERE" --null --no-recursion -T - -cf - | tar -C "$1" -xf -
}

# The aarch64 install path: the project's wheel and the aarch64 wheels of its other dependencies
# (fetched here, with torch pinned to the sysroot's CPU build), installed offline by the sysroot's own
# pip under qemu into a venv that sees /opt/site. The wheel is rebuilt and reinstalled every time, so
# the venv holds this checkout's code.
install_venv() {
  rm -rf "$WHEELS/project" && mkdir -p "$WHEELS/project" "$WHEELS/deps"
  # Built from a copy of what the wheel holds: an in-tree build writes build/ in the checkout, where
  # the tests' own wheel build (tests/install) may be running at the same time (.ci/run overlaps them).
  local src
  src=$(mktemp -d)
  copy_wheel_sources "$src"
  "$HERE/.venv/bin/python" -m pip wheel -q "$src" --no-deps --no-build-isolation --no-index -w "$WHEELS/project" >&2
  rm -rf "$src"
  local wheel
  wheel=$(cd "$WHEELS/project" && ls paretopipe-*.whl)
  # every dependency but torch and torchvision, which the sysroot already has in /opt/site; fetched
  # again whenever the list changes (the marker holds the list it was fetched for)
  local deps
  deps=$("$HERE/.venv/bin/python" - "$WHEELS/project/$wheel" <<'PY'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [Requirement(r) for r in Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []]
print("\n".join(str(r) for r in reqs if r.name not in ("torch", "torchvision", "mlcommons-loadgen")
                and not (r.marker and "extra" in str(r.marker))))
# ONNX Runtime and the exporter's onnx from the engines extra: a Pi runs an --engine onnxruntime stage
print("\n".join(f"{r.name}{r.specifier}" for r in reqs if r.name in ("onnxruntime", "onnx")))
PY
)
  local loadgen
  loadgen=$("$HERE/.venv/bin/python" - "$WHEELS/project/$wheel" <<'PY'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [Requirement(r) for r in Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []]
print(next(str(r) for r in reqs if r.name == "mlcommons-loadgen"))
PY
)
  if [ "$(cat "$WHEELS/deps/.complete" 2>/dev/null)" != "$deps" ]; then
    printf 'torch==2.9.1\ntorchvision==0.24.1\n' > "$WHEELS/deps/constraints.txt"
    mapfile -t reqs <<< "$deps"
    "$PIP" download -q "${PLAT[@]}" -c "$WHEELS/deps/constraints.txt" -d "$WHEELS/deps" "${reqs[@]}" >&2
    printf '%s' "$deps" > "$WHEELS/deps/.complete"
  fi
  local qenv=(/usr/bin/env QEMU_CPU="$QEMU_CPU" HOME=/tmp "PATH=$VENV/bin:/usr/bin:/bin")
  if [ ! -x "$ROOTFS$VENV/bin/python3" ]; then
    chroot "$ROOTFS" "${qenv[@]}" python3 -m venv "$VENV"
    echo /opt/site > "$(echo "$ROOTFS$VENV"/lib/python3*/site-packages)/sysroot-torch.pth"
  fi
  # LoadGen from its source distribution, built under qemu by the sysroot's g++ (minutes, once: the
  # marker holds the requirement it was built for); its build dependencies are fetched here
  if [ "$(cat "$WHEELS/loadgen/.complete" 2>/dev/null)" != "$loadgen" ]; then
    rm -rf "$WHEELS/loadgen" && mkdir -p "$WHEELS/loadgen"
    "$PIP" download -q --no-deps --no-binary :all: -d "$WHEELS/loadgen" "$loadgen" >&2
    "$PIP" download -q -d "$WHEELS/loadgen" "setuptools>=42" wheel "pybind11==2.11.1" >&2
    chroot "$ROOTFS" "${qenv[@]}" "$VENV/bin/pip" install -q --disable-pip-version-check --no-index \
      --find-links /opt/wheels/loadgen "$loadgen" >&2
    printf '%s' "$loadgen" > "$WHEELS/loadgen/.complete"
  fi
  local engines
  mapfile -t engines < <(printf '%s\n' "$deps" | grep -E '^(onnxruntime|onnx)[<>=!~ ]' || true)
  chroot "$ROOTFS" "${qenv[@]}" "$VENV/bin/pip" install -q --disable-pip-version-check --no-index \
    --find-links /opt/wheels/deps --find-links /opt/wheels/loadgen "/opt/wheels/project/$wheel" "${engines[@]}" >&2
  chroot "$ROOTFS" "${qenv[@]}" "$VENV/bin/pip" install -q --disable-pip-version-check --no-index --no-deps \
    --force-reinstall "/opt/wheels/project/$wheel" >&2
  mkdir -p "$(dirname "$WRAPPER")"
  # What a lab host's REMOTE_PYTHON runs: the venv's python under qemu, as on a Pi with this core.
  # A private mount namespace gives it /proc (psutil needs it) and leaves nothing mounted behind;
  # /sys stays the sysroot's empty one, because the x86 /sys confuses torch's CPU detection.
  sed -e "s|@ROOTFS@|$ROOTFS|" -e "s|@QEMU_CPU@|$QEMU_CPU|" -e "s|@VENV@|$VENV|g" > "$WRAPPER" <<'SH'
#!/bin/sh
exec unshare -m sh -c 'root=$1; shift; mount -t proc proc "$root/proc" && exec chroot "$root" /usr/bin/env \
  QEMU_CPU=@QEMU_CPU@ HOME=/tmp OMP_NUM_THREADS=1 PATH=@VENV@/bin:/usr/sbin:/usr/bin:/sbin:/bin @VENV@/bin/python3 "$@"' \
  sh @ROOTFS@ "$@"
SH
  chmod 755 "$WRAPPER"
  echo "$WRAPPER"
}

case "${1:-}" in
  setup) setup ;;
  state) echo "rootfs $(rootfs_state), site $(site_state)" ;;
  venv) setup; install_venv ;;
  fingerprints) setup; run_python /opt/paretopipe/scripts/zoo_fingerprints.py ;;
  python) shift; setup; run_python "$@" ;;
  sources) [ -d "${2:-}" ] || { echo "usage: arm_sysroot.sh sources DIR (an existing folder)" >&2; exit 2; }
    copy_wheel_sources "$2" ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
