# Two commands set up a fresh machine (see README.md):
#   make main   - set up .venv, then run the main job
#   make test   - set up .venv, then run the linter and the test suite
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup main test test-all lint clean gpu-check

# A virtual environment in the repo for this machine (scripts/setup_env.py): PyTorch 2.13.0, the CPU wheel (from
# this machine's wheel folder if it has one) or, where nvidia-smi sees a GPU, the image's own CUDA PyTorch or the
# CUDA build its driver runs (a GPU PyTorch cannot use stops here, in one line); a .venv made for another kind of
# machine is made again; then this package. Kept as it is when current.
setup:
	@python3 scripts/setup_env.py --venv $(VENV)

main: setup
	$(PY) scripts/main.py

# The GPU check (docs/gpu.md): the gpu tests, a main job and the benchmark of base, as one table
# (and gpu_check.json), in nine and a half minutes; on a machine without a GPU the same steps scaled down, said so.
gpu-check: setup
	$(PY) -m hf_vanilla_transformer gpu-check --output gpu_check.json

test: setup lint
	$(PY) -m pytest -m "not slow and not gpu" --durations=15

test-all: setup lint
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
