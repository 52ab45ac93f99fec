# All set-up happens here, on a fresh machine: a venv, the pinned torch, the package and its extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench setup clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,pretrained,web,gpu]'
	# The browser tests drive Debian's chromium through Playwright (never `playwright install`).
	@[ -x /usr/bin/chromium ] || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }; }
	touch $(STAMP)

setup: $(STAMP)

# The main job (about 4 minutes): train a small GPT, sample with the KV cache, verify --quick, draw attention maps.
demo: $(STAMP)
	$(BIN)/attnlab demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow"

bench: $(STAMP)
	$(BIN)/attnlab bench

clean:
	rm -rf $(VENV) bench-results
