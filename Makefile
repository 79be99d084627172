# Entry points of the workshop. Every target sets up what it needs itself.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 2

.PHONY: setup cluster-up cluster-down test test-tools test-fast demo book lab clean nemo-env nemo-check

NODE_STAMP := node_modules/.package-lock.json

setup: $(STAMP) $(NODE_STAMP)  ## virtual environment with the library, training and book extras (idempotent)

# Pyodide for the book's memory calculator (package.json pins it, package-lock.json its hash): the build copies
# it next to the page, so the page runs the workshop's Python estimator offline, with no CDN.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts
	touch $@

# Re-installs only when the dependency files change. Every version comes from requirements.lock, the
# lock environment.yml uses on Ibex too. DeepSpeed's ops are not built at install time; the one the CPU
# runs need (its shared-memory all-reduce) is built here once, so no job pays ~50 s for it.
# Each step says what it does and how long it took: pip runs quiet, and the first setup takes minutes.
$(STAMP): pyproject.toml requirements.lock
	@echo "==> make setup: $(VENV) with the locked packages (PyTorch CPU, DeepSpeed, Jupyter Book; about 1.9 GB, 5-8 min the first time on 2 cores; pip is quiet meanwhile)"
	@started=$$(date +%s); \
	 { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); } && \
	 $(BIN)/pip install -q --upgrade pip wheel setuptools && \
	 DS_BUILD_OPS=0 $(BIN)/pip install -q -c requirements.lock -e '.[train,book,test]' && \
	 echo "    packages installed in $$(( $$(date +%s) - started )) s"
	$(BIN)/python -m workshop_lib.sites.lab_settings
	@echo "==> make setup: DeepSpeed's CPU op, compiled once into $(VENV)/torch_extensions (about 1 min on 2 cores)"
	$(BIN)/python -m workshop_lib.train.prebuild_ops
	touch $@

cluster-up: setup  ## start the local SLURM cluster (root; installs SLURM if missing)
	$(BIN)/workshop cluster up --nodes $(NODES)

cluster-down:  ## stop every daemon the local cluster started
	@if [ -x $(BIN)/workshop ]; then $(BIN)/workshop cluster down; else echo "nothing to stop"; fi

# The slow part executes every chapter with papermill (tiny profile, local SLURM cluster), builds the book
# with warnings as errors and checks the pages in headless Chromium (tests/book/test_notebooks.py,
# tests/book/test_book_browser.py); screenshots land in _build/screenshots/.
# About 50 minutes on 2 cores of its own (fresh clone, 2026-11-27), 21 of them executing the chapters
# (a [workshop] line per chapter and job says how far
# it is). The end of the run lists what it could not cover and the command that would.
test: setup test-tools  ## the whole test suite (starts and stops the local cluster itself)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q

# The browser tests need Chromium and the script tests shellcheck, as in CI (.ci/run): installed here when missing
# and this is root with apt-get (about 1 min, 300 MB); otherwise those tests are skipped and the run's end says so.
test-tools:
	@missing=""; \
	 command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="$$missing chromium"; \
	 command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	 if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	   echo "==> make test: installing$$missing for the browser and shell-script tests (apt-get, about 1 min)"; \
	   export DEBIAN_FRONTEND=noninteractive; \
	   apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1 || \
	   { apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } || \
	   echo "    could not install$$missing: the tests that need them are skipped (listed at the end)"; \
	 elif [ -n "$$missing" ]; then \
	   echo "==> make test: no$$missing here (not root, or no apt-get): the tests that need them are skipped"; \
	 fi

test-fast: setup  ## tests that start no cluster and train nothing (markers: slow, cluster, train)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -q -m "not slow and not cluster and not train"

demo: setup  ## the workshop end to end on the local default (tiny profile, local SLURM)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m workshop_lib.cli.demo

# WORKSHOP_SUBMIT=0: the chapters only read the runs in runs/ (run `make demo` or the notebooks first).
# The execution cache is dropped and every page rebuilt (--all): both are keyed on the sources, and the
# results in runs/ may be newer than the last build.
book: setup  ## build the book from the runs already in runs/ (submits nothing)
	rm -rf _build/.jupyter_cache
	WORKSHOP_SUBMIT=0 $(BIN)/jupyter-book build . --all -W --keep-going

# Jobs submitted from the notebooks inherit PATH, so this environment comes first. Root (a container,
# the CI machine) must say --allow-root; LAB_ARGS passes more, e.g. LAB_ARGS="--no-browser --port 8888".
LAB_ARGS ?=
lab: setup  ## JupyterLab where the .py chapters open as notebooks
	$(BIN)/python -m workshop_lib.sites.lab_settings
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter lab --notebook-dir=. $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:  ## remove build output (keeps runs/ and the environment)
	rm -rf _build

# NeMo 2.4.1 (the 25.07 container's) in its own cached environment (~/.cache/workshop/nemo-venv/<hash of the
# lock>, ~2.5 min and 2.4 GB once), then every chapter 1-2 command resolved by NeMo into book/reference/nemo/.
nemo-env: setup  ## the NeMo environment that checks the chapters' commands (no GPU needed)
	$(BIN)/python -m workshop_lib.nemo_check.environment

nemo-check: nemo-env  ## resolve every chapter 1-2 `nemo llm finetune` command with NeMo (book/reference/nemo/)
	$(BIN)/python -m workshop_lib.nemo_check.check
