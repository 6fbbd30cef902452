# adaptive-spec: `make demo` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned for the install: on these machines torch==2.13.0 is a local CPU wheel,
# while an unpinned torch pulls a multi-GB CUDA build. pyproject.toml keeps a range.
TORCH_PIN ?= torch==2.13.0
JOBS ?= 2

.PHONY: setup demo test lint bench-verifiers zoo selector clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(BIN)/adaptive-spec demo --out data/demo

bench-verifiers: setup
	$(BIN)/adaptive-spec bench verifiers --json data/bench/verifiers.json
	$(BIN)/adaptive-spec bench verifiers --speed --json data/bench/verifiers_speed.json

test: setup
	$(BIN)/ruff check adaptive_spec tests
	$(BIN)/python -m pytest -n $(JOBS) -q

# collect -> label -> train -> export -> bench; installs the selector that `make demo` uses.
selector: setup
	$(BIN)/adaptive-spec selector-pipeline --seed 1 --install

zoo: setup
	$(BIN)/adaptive-spec zoo build --out adaptive_spec/zoo/default --minutes 60

lint: setup
	$(BIN)/ruff check adaptive_spec tests
	$(BIN)/ruff format --check adaptive_spec tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
