# Set-up and the two entry points of the README. The venv is created once;
# torch==2.13.0 (CPU) is installed before anything else can pull another torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run test bench-transport

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m app.run

test: install
	$(PY) -m pytest -q

bench-transport: install
	$(PY) benchmarks/transport.py
