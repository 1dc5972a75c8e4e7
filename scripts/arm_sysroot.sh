#!/usr/bin/env bash
# An aarch64 Python with torch on this x86 machine: qemu-user in a debootstrap sysroot, cached
# outside the repository (ARM_CACHE, default /var/cache/paretopipe-arm; about 1 GB). Needs root.
#
#   bash scripts/arm_sysroot.sh setup          build what is missing (about 7 minutes cold)
#   bash scripts/arm_sysroot.sh fingerprints   print the zoo's default-weights fingerprints as JSON
#   bash scripts/arm_sysroot.sh python ARGS    run the sysroot's python3 (this checkout at /opt/paretopipe)
#
# QEMU_CPU is a Pi's core (cortex-a72 by default; cortex-a76 for a Pi 5): qemu's default "max"
# CPU (512-bit SVE) computes F.linear wrongly. PyPI's aarch64 torch 2.14 wheels are CUDA builds
# whose CUDA libraries do not resolve here; torch 2.9.1 is PyPI's CPU build for aarch64, and the
# default weights do not depend on the torch version (they are drawn by numpy's PCG64).
set -euo pipefail
CACHE=${ARM_CACHE:-/var/cache/paretopipe-arm}
ROOTFS=$CACHE/rootfs
SITE=$CACHE/site
QEMU_CPU=${QEMU_CPU:-cortex-a72}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PIP=${PIP:-$HERE/.venv/bin/pip}

setup() {
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq qemu-user-static binfmt-support debootstrap >/dev/null
  fi
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    mkdir -p "$ROOTFS"
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,python3-venv,python3-pip bookworm "$ROOTFS" >&2
    chroot "$ROOTFS" /debootstrap/debootstrap --second-stage >&2
  fi
  if [ ! -d "$SITE/torch" ]; then
    local plat=(--only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux2014_aarch64)
    for v in 17 28 34 35 36; do plat+=(--platform "manylinux_2_${v}_aarch64"); done
    "$PIP" install -q "${plat[@]}" --target "$SITE" --no-deps torch==2.9.1 torchvision==0.24.1 >&2
    "$PIP" install -q "${plat[@]}" --target "$SITE" --upgrade numpy typing_extensions sympy networkx jinja2 fsspec \
      filelock platformdirs pillow >&2
  fi
}

run_python() {
  mkdir -p "$ROOTFS/opt/site" "$ROOTFS/opt/paretopipe"
  mountpoint -q "$ROOTFS/opt/site" || mount --bind "$SITE" "$ROOTFS/opt/site"
  mountpoint -q "$ROOTFS/opt/paretopipe" || mount --bind -o ro "$HERE" "$ROOTFS/opt/paretopipe"
  trap 'umount "$ROOTFS/opt/paretopipe" "$ROOTFS/opt/site" 2>/dev/null || true' EXIT
  chroot "$ROOTFS" /usr/bin/env QEMU_CPU="$QEMU_CPU" PYTHONPATH=/opt/site:/opt/paretopipe HOME=/tmp \
    OMP_NUM_THREADS=1 python3 "$@" 2> >(grep -v -e NNPACK -e cpuinfo >&2)
}

case "${1:-}" in
  setup) setup ;;
  fingerprints) setup; run_python /opt/paretopipe/scripts/zoo_fingerprints.py ;;
  python) shift; setup; run_python "$@" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
