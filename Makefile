# Two commands set up a fresh machine (see README.md):
#   make main   - set up .venv, then run the main job
#   make test   - set up .venv, then run the linter and the test suite
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup main test test-all lint clean

setup: $(STAMP)

# 1. a virtual environment in the repo; 2. PyTorch: the CUDA build where a GPU is present, else the CPU wheel
# torch 2.13.0 (from this machine's wheel folder if it has one, else from PyTorch's CPU index); 3. this package.
$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install 'torch>=2.6,<2.15'; \
	elif $(PY) -m pip install --quiet --no-index --no-deps torch==2.13.0 2>/dev/null; then \
		echo "torch 2.13.0 (CPU wheel) installed from this machine's wheel folder"; \
	else \
		$(PY) -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

main: setup
	$(PY) scripts/main.py

test: setup lint
	$(PY) -m pytest -m "not slow and not gpu" --durations=15

test-all: setup lint
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
