#!/usr/bin/env bash
# Build llama.cpp's RPC server (ggml-rpc-server), llama-server and llama-bench, CPU only, from the
# llama.cpp tree that the registry's llama-cpp-python sdist vendors (pinned below by version and
# sha256), into a versioned cache: a second run with the same pin, flags, machine and compiler
# prints the same folder at once. On a Pi the same script builds natively (GGML_NATIVE).
#
#   bash scripts/build_llamacpp.sh            # prints the folder that holds the three binaries
#   LLAMACPP_SDIST=/path/llama_cpp_python-0.3.36.tar.gz bash scripts/build_llamacpp.sh   # offline
#
# The sdist comes from the package registry (pip download) when LLAMACPP_SDIST is not given; either
# way its sha256 must be the pinned one. The build itself is offline (no prebuilt web UI, no OpenSSL: nothing fetched).
# It takes about 11 minutes on 2 cores (docs/llm.md). Cache: $PARETOPIPE_LLAMACPP_DIR, else
# ${XDG_CACHE_HOME:-~/.cache}/paretopipe/llamacpp/<key>/bin, written under a temporary name and
# renamed into place, so an interrupted build leaves nothing that a later run would take for done.
set -euo pipefail

PIN=0.3.36
# What a sweep (paretopipe/llm/llamacpp.py, PIN and RECIPE there too) takes from the cache: a build
# of this pin and recipe for this machine. Bump RECIPE when the flags change what runs.
RECIPE=2
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF)
if [ "$(uname -m)" = x86_64 ]; then
  # Not -march=native on x86: a native build on a CPU with AMX runs AMX tile kernels that a VM
  # without AMX state enabled kills with SIGILL (llama-server died so at its first batch), and a
  # cache shared by machines of one architecture must run on all of them. AVX2 and FMA are what
  # every x86 server and laptop of the last decade has. A Pi builds natively (its own CPU).
  FLAGS+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
fi
TARGETS=(ggml-rpc-server llama-server llama-bench)

for tool in cmake c++ sha256sum tar; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (cmake and g++ build llama.cpp)" >&2; exit 1; }
done
compiler=$(c++ --version | head -n 1)
key=$(printf '%s\n' "$PIN" "$SHA256" "${FLAGS[*]}" "${TARGETS[*]}" "$(uname -m)" "$compiler" | sha256sum | cut -c1-16)
root=${PARETOPIPE_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/paretopipe/llamacpp}
dest="$root/$PIN-$key"
if [ -x "$dest/bin/ggml-rpc-server" ] && [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/llama-bench" ]; then
  echo "$dest/bin"
  exit 0
fi

work=$(mktemp -d -t paretopipe-llamacpp.XXXXXX)
trap 'rm -rf "$work"' EXIT
sdist=${LLAMACPP_SDIST:-}
if [ -z "$sdist" ]; then  # from the registry pip is configured for (no index URL of our own)
  python3 -m pip download -q "llama-cpp-python==$PIN" --no-deps --no-binary :all: -d "$work/sdist" >&2
  sdist="$work/sdist/llama_cpp_python-$PIN.tar.gz"
fi
got=$(sha256sum "$sdist" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "error: $sdist has sha256 $got, not the pinned llama-cpp-python $PIN's $SHA256" >&2
  exit 1
fi
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$PIN/vendor/llama.cpp"
echo "building ${TARGETS[*]} from llama-cpp-python $PIN's llama.cpp into $dest (about 11 minutes on 2 cores)" >&2
start=$(date +%s)
cmake -S "$src" -B "$work/build" "${FLAGS[@]}" >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target "${TARGETS[@]}" -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
mkdir -p "$root"
staged=$(mktemp -d "$root/.building.XXXXXX")
mkdir -p "$staged/bin"
for t in "${TARGETS[@]}"; do cp "$work/build/bin/$t" "$staged/bin/"; done
printf '{"llama_cpp_python": "%s", "recipe": %d, "sdist_sha256": "%s", "flags": "%s", "machine": "%s", "compiler": "%s", "build_s": %d}\n' \
  "$PIN" "$RECIPE" "$SHA256" "${FLAGS[*]}" "$(uname -m)" "$compiler" "$(( $(date +%s) - start ))" > "$staged/build.json"
rm -rf "$dest"
mv "$staged" "$dest"
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$dest/bin"
