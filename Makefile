# The two set-up commands: `make demo` and `make test`. Both create or reuse .venv and install, at
# the exact versions of $(LOCK): `make demo` what the demo needs, `.[demo]` (torch, tokenizers,
# transformers, tqdm: a third of the development environment's install, the first thing a newcomer
# waits for); `make test` (and lint, docs, ...) the development environment, `.[torch,dev]`, which
# holds `.[demo]`.
#
# Refresh the lock (newer releases, or a changed dependency in pyproject.toml): `make lock`.
# It resolves `.[torch,dev]` afresh in a scratch venv, torch held at 2.13.0 (the CPU build
# this machine has on disk: any other version downloads a CUDA build of several GB), and
# writes what got installed, `pip freeze`, to $(LOCK). Commit the new lock; the next `make`
# reinstalls .venv from it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tidal-installed
DEMO_STAMP := $(VENV)/.tidal-demo-installed
LOCK := requirements/dev.lock
# the peers' writers for the format tests, installed without their dependencies (see the file)
PEERS := requirements/peers.txt
LOCK_VENV := .venv-lock
TORCH := torch==2.13.0
# Azurite, the Azure Blob emulator the tests start (tests/azure_server.py): a Node.js program, pinned
# with all its dependencies in requirements/azurite/ and installed with `npm ci` into .venv/azurite
AZURITE := requirements/azurite
AZURITE_STAMP := $(VENV)/azurite/.installed

.PHONY: demo test conformance lint docs wheel-check bench lock clean

# Python writes the bytecode of what it imports, once, into .venv: where PYTHONDONTWRITEBYTECODE is
# set (CI's machines), every process would compile torch, JAX and transformers from source again,
# which doubled the test suite's time. An empty value is "unset" to Python.
export PYTHONDONTWRITEBYTECODE :=

# Reinstalls when the lock, pyproject.toml or this file changes. --no-compile: Python compiles
# the modules a run imports when it first imports them, not every file of every package now.
$(STAMP): $(LOCK) $(PEERS) pyproject.toml Makefile | $(AZURITE_STAMP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile -c $(LOCK) -e '.[torch,dev]'
	$(BIN)/python -m pip install -q --no-compile --no-deps -r $(PEERS)
	touch $(STAMP) $(DEMO_STAMP)

# The demo's part of the environment only: no Azurite, no peers' writers, no test tools.
$(DEMO_STAMP): $(LOCK) pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile -c $(LOCK) -e '.[demo]'
	touch $(DEMO_STAMP)

# Where npm is missing there is no Azurite: the Azure tests skip and say why (anywhere else a
# missing Azurite fails them). Reinstalls when the pinned versions change.
$(AZURITE_STAMP): $(AZURITE)/package.json $(AZURITE)/package-lock.json
	if command -v npm >/dev/null 2>&1; then \
	  rm -rf $(VENV)/azurite && mkdir -p $(VENV)/azurite && \
	  cp $(AZURITE)/package.json $(AZURITE)/package-lock.json $(VENV)/azurite/ && \
	  npm ci --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm is not installed: no Azurite, so the Azure tests will be skipped"; fi

demo: $(DEMO_STAMP)
	$(BIN)/tidal demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

# Two test processes (pytest-xdist), each module in one of them (its fixtures made once): most
# tests wait on processes they start, so two fit 2 cores; the suite takes ~18 minutes, not ~25.
TEST_PROCESSES ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile

# The conformance matrix (tests/conformance, docs/conformance.md) beyond the sample `make test` runs:
# CELLS cells drawn from the seeds SEED, SEED+1, ... (default: a new SEED, printed first). A failing
# cell prints the command that runs it alone: `make conformance CELLS=1 SEED=<its seed>`.
CELLS ?= 100
ifeq ($(origin SEED), undefined)
SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(10**6))')
endif

conformance: $(STAMP)
	@echo "conformance: $(CELLS) cells from seed $(SEED)"
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist load tests/conformance --cells $(CELLS) --seed $(SEED)

# the documentation site (mkdocs.yml): docs/ and an API reference made from the docstrings, into
# site/; --strict: a broken link or anchor, a page out of the nav or a docstring that does not
# parse fails it (CI runs it after `make test`)
docs: $(STAMP)
	$(BIN)/mkdocs build --strict -d site

# the package as users get it, no tests: the sdist, the wheel built from it, installed into a clean
# venv at the lock's versions, and the README's quick start and `tidal --version` run from outside
# the tree (.ci/wheel-check; CI runs it after `make test`; about 2 minutes)
wheel-check: $(STAMP)
	BUILD_PYTHON=$(BIN)/python PYTHON=$(PYTHON) bash .ci/wheel-check

# bench_peers.py: tidal next to LitData, Mosaic, WebDataset and HF datasets on one corpus (about 25
# minutes; the first run adds about 5 for the corpus, its conversions and the tokenizer);
# bench_shaped.py: the same copies from S3 over a shaped link (latency, bandwidth, throttling)
bench: $(STAMP)
	$(BIN)/python bench/bench_read.py
	$(BIN)/python bench/bench_peers.py --json bench-data/peers/last.json \
	  --markdown bench-data/peers/last.md --plot bench-data/peers/last.png
	$(BIN)/python bench/bench_shaped.py --json bench-data/shaped/last.json

lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	echo '$(TORCH)' > $(LOCK_VENV)/torch.txt
	$(LOCK_VENV)/bin/python -m pip install -q -c $(LOCK_VENV)/torch.txt $(TORCH)
	$(LOCK_VENV)/bin/python -m pip install -q -c $(LOCK_VENV)/torch.txt -e '.[torch,dev]'
	$(LOCK_VENV)/bin/python -m pip check
	{ echo '# The development environment, .[torch,dev], at exact versions: `make` installs it with'; \
	  echo '# `pip install -c $(LOCK) -e ".[torch,dev]"`. Made by `make lock` (Python' \
	    "$$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())'));" 'do not edit by hand.'; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed 's/^\(torch==[^+]*\)+cpu$$/\1/'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) $(LOCK_VENV) .pytest_cache .mypy_cache .ruff_cache site
