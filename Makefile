# adaptive-spec: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned for the install: on these machines torch==2.13.0 is a local CPU wheel,
# while an unpinned torch pulls a multi-GB CUDA build. pyproject.toml keeps a range.
TORCH_PIN ?= torch==2.13.0
JOBS ?= 2

.PHONY: help setup demo test test-fast lint bench-verifiers gpu-check zoo drafts selector clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: $(STAMP)  ## venv in .venv with the engine, every extra and the test tools (.[all,dev])

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

demo: setup  ## SmolLM2 and its EAGLE-style head (fetched on first use) on a dozen chat prompts: table, report in data/demo
	$(BIN)/adaptive-spec demo --out data/demo

bench-verifiers: setup  ## block efficiency vs the LP limit, and verifier speed
	$(BIN)/adaptive-spec bench verifiers --json data/bench/verifiers.json
	$(BIN)/adaptive-spec bench verifiers --speed --json data/bench/verifiers_speed.json

test: setup  ## ruff (lint and format check), then the whole test suite (slow tests included)
	$(BIN)/ruff check adaptive_spec tests
	$(BIN)/ruff format --check adaptive_spec tests
	$(BIN)/python -m pytest -n $(JOBS) -q

test-fast: setup  ## the test suite without the slow-marked tests
	$(BIN)/python -m pytest -n $(JOBS) -q -m "not slow"

# On a CUDA machine: the gpu tests, one pass per row count, bench e2e on the demo prompts (README: On a GPU).
# DEVICE=cpu is the dry run. Writes data/gpu-check/.
DEVICE ?= cuda
gpu-check: setup  ## the GPU check: gpu tests, captured vs eager passes, bench e2e (DEVICE=cpu: the dry run)
	PYTHON=$(BIN)/python tools/gpu-check.sh --device $(DEVICE) --out data/gpu-check

# collect -> label -> train -> export -> bench; installs the selector that `make demo` uses
# into the user data folder ($$ADAPTIVE_SPEC_HOME, default ~/.local/share/adaptive-spec).
selector: setup  ## train the plan selector and install it for make demo (user data folder)
	$(BIN)/adaptive-spec selector pipeline --seed 1 --install

drafts: setup  ## retrain SmolLM2's committed EAGLE-style head and standalone draft (resumable; hours on 2 cores)
	$(BIN)/adaptive-spec zoo drafts smollm2

zoo: setup  ## rebuild the committed built-in pair (60 minutes)
	$(BIN)/adaptive-spec zoo build --out adaptive_spec/zoo/default --minutes 60

lint: setup  ## ruff check and ruff format --check
	$(BIN)/ruff check adaptive_spec tests
	$(BIN)/ruff format --check adaptive_spec tests

clean:  ## remove the venv and the caches
	rm -rf $(VENV) .pytest_cache .ruff_cache
