# Two commands set everything up on a fresh machine with Python 3.11+ and make:
#   make run    create .venv if missing, install, run the daemon (config/sessiond.toml)
#   make test   create .venv if missing, install, run ruff, mypy --strict and pytest
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Starting sessiond in the foreground with config/sessiond.toml (Ctrl-C stops it)."
	@echo "Sessions from config/sessions/ are loaded; the state is in $(CURDIR)/state."
	@echo "In another terminal, try:"
	@echo "  export SESSIOND_SOCKET=$(CURDIR)/state/sessiond.sock"
	@echo "  $(BIN)/sessionctl ps"
	@echo "  $(BIN)/sessionctl activate hello && $(BIN)/sessionctl log hello"
	@echo "  $(BIN)/sessionctl send hello 'wake up' && $(BIN)/sessionctl show hello"
	@echo "  $(BIN)/sessionctl send notes 'remember the milk' --from ann"
	@echo "  $(BIN)/sessionctl replay notes --view messages"
	@echo "  $(BIN)/sessionctl fork notes --as side && $(BIN)/sessionctl merge side --summary done"
	@echo
	$(BIN)/sessiond --config config/sessiond.toml

# An offline tour of the event log: write, tear, repair, replay, fork, export, fsck.
demo: $(STAMP)
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
	rm -rf $(VENV) state .demo-state .bench-work .mypy_cache .ruff_cache .pytest_cache .hypothesis
