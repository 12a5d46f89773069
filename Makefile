# Two commands: `make demo` and `make test`. Each creates .venv when missing and installs flowride into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The cluster extra (psycopg) is for the task-queue tests, which also start a PostgreSQL server
# (initdb/pg_ctl from Debian's postgresql package: .ci/run installs it; without it they skip).
# Optional: a pinned torch to install first (CI sets TORCH_SPEC=torch==2.13.0, a CPU build on local disk).
TORCH_SPEC ?=

.PHONY: demo test test-slow lint setup clean bench

$(BIN)/flowride: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/pip install -q "$(TORCH_SPEC)"; fi
	$(BIN)/pip install -q -e ".[dev,cluster]"
	touch $(BIN)/flowride

setup: $(BIN)/flowride

demo: setup
	$(BIN)/flowride demo

# The suite runs on TEST_WORKERS processes (pytest-xdist; 2 = the CI machine's cores).
# TEST_WORKERS=0 runs it in one process. `make test` leaves out the tests marked slow (cases
# that only show their property at a scale of minutes); `make test-slow` runs those, and CI
# runs both (.ci/run). docs/testing.md says what each target holds and how long it takes.
TEST_WORKERS ?= 2

test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

test-slow: setup
	FLOWRIDE_SLOW_TESTS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m slow

lint: setup
	$(BIN)/ruff check src tests benchmarks examples

bench: setup
	$(BIN)/python benchmarks/synth.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
