# All set-up happens here, on a fresh machine: a venv, the pinned torch, the package and its extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench setup clean

$(STAMP): pyproject.toml setup.py Makefile package-lock.json $(wildcard src/attnlab/csrc/*)
	$(PY) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# The compiled kernel (setup.py) builds against that torch: no build isolation, which would fetch
	# a multi-GB torch into a throwaway environment. setuptools/wheel/ninja are the build's own tools.
	$(BIN)/pip install --quiet 'setuptools>=68' wheel ninja
	$(BIN)/pip install --quiet --no-build-isolation -e '.[test,pretrained,web,gpu]'
	# The lesson page's in-browser Python: pyodide pinned in package-lock.json, into node_modules/ (web/lesson.py).
	@command -v npm >/dev/null || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q npm >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q npm; }; }
	npm ci --no-audit --no-fund --loglevel=error
	# The browser tests drive Debian's chromium through Playwright (never `playwright install`).
	@[ -x /usr/bin/chromium ] || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }; }
	touch $(STAMP)

setup: $(STAMP)

# The main job (118 s on the 2-core AMD Zen 4, docs/benchmarks.md "Issue #7"): train a small GPT, sample with the KV cache, verify --quick, draw attention maps.
demo: $(STAMP)
	$(BIN)/attnlab demo

# Lint first (about a second; the rules are in pyproject.toml [tool.ruff]), then the fast tests.
test: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest -n 2 -m "not slow"

bench: $(STAMP)
	$(BIN)/attnlab bench

clean:
	rm -rf $(VENV) bench-results node_modules
