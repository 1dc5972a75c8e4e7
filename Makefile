# make test / make demo create .venv on first use and reuse it while requirements.txt is unchanged.
PY      := .venv/bin/python
STAMP   := .venv/.requirements.sha256
REQHASH := $(shell sha256sum requirements.txt pyproject.toml | sha256sum | cut -c1-16)

.PHONY: venv sysdeps test demo bench clean

venv:
	@if [ ! -x $(PY) ] || [ "$$(cat $(STAMP) 2>/dev/null)" != "$(REQHASH)" ]; then \
	  echo "installing into .venv (first run takes a few minutes)"; \
	  python3 -m venv .venv && \
	  $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -r requirements.txt && \
	  $(PY) -m pip install -q --no-deps --no-build-isolation -e . && \
	  $(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null && \
	  echo "$(REQHASH)" > $(STAMP); \
	fi

# System tools the tests use for real components (faketime, sshd, iproute2, iperf3, shellcheck).
# Installed when missing and when we can (root + apt); tests skip with a reason otherwise.
sysdeps:
	@bash scripts/install_sysdeps.sh

test: venv sysdeps
	$(PY) -m pytest -q

demo: venv
	$(PY) automated_split_tester.py --model mobilenetv2 --splits all --runs 2 --profiles lan,wifi,lte \
	  --batch-size 1 --num-batches 10 --warmup 1 --in-flight 4 --out results

bench: venv
	$(PY) benchmarks/run_all.py

clean:
	rm -rf .venv .pytest_cache
