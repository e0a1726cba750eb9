# Two commands set everything up on a fresh machine with Python 3.11+ and make:
#   make run    create .venv if missing, install, run the main job
#   make test   create .venv if missing, install, run ruff, mypy --strict and pytest
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench fsck-demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m sessiond.demo

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check sessiond tests
	$(BIN)/ruff format --check sessiond tests

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

# Not part of `make test`: figures, not pass/fail (see bench/README.md).
bench: $(STAMP)
	$(BIN)/python -m sessiond.bench

clean:
	rm -rf $(VENV) .demo-state .bench-work .mypy_cache .ruff_cache .pytest_cache .hypothesis
