# Set-up and the two entry points of the README. The venv is created once;
# torch==2.13.0 (CPU) is installed before anything else can pull another torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# where no local CPU wheel of torch 2.13.0 is configured (PyPI's default build pulls CUDA).
TORCH_PIP_ARGS ?=

.PHONY: install run test test-integration bench-transport

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m app.run

test: install
	$(PY) -m pytest -q

# whole runs, deployments and server processes (the markers in pyproject.toml); CI runs both targets
test-integration: install
	$(PY) -m pytest -q -m 'integration and not slow'

bench-transport: install
	$(PY) benchmarks/transport.py
