# Set-up and the two entry points of the README. The venv is created once;
# torch==2.13.0 (CPU) is installed before anything else can pull another torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# where no local CPU wheel of torch 2.13.0 is configured (PyPI's default build pulls CUDA).
TORCH_PIP_ARGS ?=
# pytest-xdist worker processes: one a core for the unit tests; twice as many for the integration
# tests, whose deployed runs mostly wait on their SuperLink's and SuperNodes' processes
TEST_WORKERS ?= auto
INTEGRATION_WORKERS ?= 4

.PHONY: install run test test-integration browser bench-transport

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
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# whole runs, deployments and server processes (the markers in pyproject.toml); CI runs both targets
test-integration: install browser
	$(PY) -m pytest -q -n $(INTEGRATION_WORKERS) --dist worksteal -m 'integration and not slow'

# headless Chromium (Debian's package), which the page test opens a run's report.html in; installed
# where apt-get runs as root, else the test says it is skipped and why
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	      chromium >/dev/null 2>&1; }; } || echo "no Chromium (apt-get install chromium): the page test is skipped"; }

bench-transport: install
	$(PY) benchmarks/transport.py
