# Two commands set everything up on a fresh machine with Python 3.11+ and make:
#   make run    create .venv if missing, install, run the daemon (config/sessiond.toml)
#   make test   create .venv if missing, install, run ruff, mypy --strict and pytest
#   make check  the fast loop: ruff, mypy --strict, the unit and in-process tests
#               (no test that starts a process; <= 3 minutes on 2 cores)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test check fast cluster bench-cluster lint typecheck unit agents example-claude-code example-codex faults faults-selftest faults-cluster bench compare load install install-user clean man

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Starting sessiond in the foreground with config/sessiond.toml (Ctrl-C stops it)."
	@echo "Sessions from config/sessions/ are loaded; the state is in $(CURDIR)/state."
	@echo "In another terminal, try (each line as written; tests/e2e/test_make_run.py runs them):"
	@echo "  cd '$(CURDIR)' && export SESSIOND_SOCKET='$(CURDIR)/state/sessiond.sock'"
	@echo "  $(BIN)/sessionctl ps"
	@echo "  $(BIN)/sessionctl activate hello && $(BIN)/sessionctl log hello"
	@echo "  $(BIN)/sessionctl send hello 'wake up' && $(BIN)/sessionctl show hello"
	@echo "  $(BIN)/sessionctl send notes 'remember the milk' --from ann"
	@echo "  $(BIN)/sessionctl replay notes --view messages"
	@echo "  $(BIN)/sessionctl fork notes --as side && $(BIN)/sessionctl merge side --summary done"
	@echo "The web console listens on http://127.0.0.1:8765 ([web] in config/sessiond.toml):"
	@echo "  $(BIN)/sessionctl web    # prints a URL that logs you in"
	@echo "  curl -s http://127.0.0.1:8765/metrics | grep ^sessiond_    # Prometheus metrics"
	@echo "Notices go to state/notices.jsonl ([[notify]] jsonl://); an approval's notice"
	@echo "carries signed approve and deny links. The deploy session asks before it runs:"
	@echo "  $(BIN)/sessionctl activate deploy    # blocked: approval pending"
	@echo "  grep -o '\"approve_url\":\"[^\"]*' state/notices.jsonl | tail -n1 | cut -d'\"' -f4"
	@echo "  $(BIN)/sessionctl notify    # the notify target's state: delivered, pending"
	@echo "Open that link in a browser and confirm: deploy runs once (or: $(BIN)/sessionctl approve deploy)."
	@echo "Traces: each session's OpenTelemetry spans, from its log, as OTLP JSON:"
	@echo "  $(BIN)/sessionctl trace export hello -o state/hello.otlp.json"
	@echo "Models: the daemon's gateway sends the runs' model calls to a scripted upstream"
	@echo "on 127.0.0.1:8766 ([[model.provider]]); the ask session calls it with no key:"
	@echo "  $(BIN)/sessionctl activate ask --wait && $(BIN)/sessionctl models"
	@echo "  $(BIN)/sessionctl log ask --type model.requested --type model.responded"
	@echo
	$(BIN)/python -m sessiond.gateway.scripted --port 8766 & up=$$!; \
	trap 'kill $$up 2>/dev/null' EXIT INT TERM; \
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/sessiond --config config/sessiond.toml

# A local cluster: a PostgreSQL from the machine's binaries (initdb into
# state/cluster/postgres, Unix socket only, fsync on) and three nodes on it,
# each started again when it exits (after a PostgreSQL restart too).
cluster: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m sessiond.localpg state/cluster

# An offline tour of the event log: write, tear, repair, replay, fork, export, fsck.
demo: $(STAMP)
	$(BIN)/python -m sessiond.demo

test: lint typecheck unit

# The fast loop: what needs no real process. Tests marked `process` (tests/conftest.py
# marks them: the e2e, cluster and fault folders, PostgreSQL, the benchmarks) are
# left to `make test`; tests/inproc runs the daemon in process (tests/inproc/harness.py).
check: lint typecheck fast

FAST_IGNORE := --ignore=tests/e2e --ignore=tests/cluster --ignore=tests/faults --ignore=tests/integrations
fast: $(STAMP)
	$(BIN)/pytest -q -m "not process" $(FAST_IGNORE)

lint: $(STAMP)
	$(BIN)/ruff check sessiond tests
	$(BIN)/ruff format --check sessiond tests

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite in parallel pytest-xdist workers. Most of its time is spent
# waiting on real daemons, PostgreSQL and the campaigns, not on the CPU, so there
# are more workers than the machine's 2 cores (bench/README.md has the figures).
# A test file stays on one worker (--dist loadfile): its tests keep their order and
# its module fixtures (the browser) start once. Each worker has its own PostgreSQL
# (tests/pgserver.py); every other resource a test takes is its own (tmp folders,
# free ports, cgroup folders named by uuid). TEST_WORKERS=0 runs it in one process;
# a plain `pytest tests/x.py` is one process too (no -n in addopts).
TEST_WORKERS ?= 4
unit: $(STAMP) agents
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=30

# The agent CLIs the end-to-end tests run for real (tests/agents/package.json pins
# them; never committed). Skipped with a note where Node.js/npm are missing: the
# tests then skip and say why (under CI=true they fail instead).
AGENTS := tests/agents/node_modules/.bin/claude tests/agents/node_modules/.bin/codex
agents:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(AGENTS); \
	else echo "npm not found: the Claude Code and Codex tests will be skipped (install nodejs and npm)"; fi

$(AGENTS) &: tests/agents/package.json tests/agents/package-lock.json
	cd tests/agents && npm ci --no-audit --no-fund --loglevel=error
	touch $(AGENTS)

# examples/claude-code offline: the real CLI and daemon, a scripted model on loopback.
example-claude-code: $(STAMP) agents
	$(BIN)/python examples/claude-code/offline.py

# examples/codex offline: the real Codex CLI and daemon, its model calls through the
# daemon's gateway to a scripted upstream on loopback.
example-codex: $(STAMP) agents
	$(BIN)/python examples/codex/offline.py

# The whole kill -9 campaign: 200 rounds, power cuts on the fault file system
# (tests/faults/faultfs.py, FUSE), then 20 rounds with durability os: about 75 minutes
# on 2 shared cores (last measured: 4,189 s + 234 s; bench/README.md). `make test` runs 6 + 2.
# Prints the invariant table; fails if one does not hold.
FAULT_ROUNDS ?= 200
faults: $(STAMP)
	$(BIN)/python -m tests.faults.campaign --iterations $(FAULT_ROUNDS)
	$(BIN)/python -m tests.faults.campaign --iterations 20 --durability os

# The campaign against eight deliberately broken builds (tests/faults/broken.py): fails
# unless each is caught, and names the invariant that caught it. `make test` runs a few.
faults-selftest: $(STAMP)
	$(BIN)/python -m tests.faults.selftest

# The kill -9 campaign against a cluster (tests/faults/cluster.py): three nodes on a
# PostgreSQL of its own, a random node killed each round. `make test` runs 4 rounds.
CLUSTER_FAULT_ROUNDS ?= 30
faults-cluster: $(STAMP)
	$(BIN)/python -m tests.faults.cluster --iterations $(CLUSTER_FAULT_ROUNDS)

# Not part of `make test`: figures, not pass/fail (see bench/README.md).
bench: $(STAMP)
	$(BIN)/python -m sessiond.bench

# The cluster backend's figures on a PostgreSQL of its own (see bench/README.md).
bench-cluster: $(STAMP)
	$(BIN)/python -m sessiond.bench.cluster --nodes

# A fleet on one PostgreSQL (docs/scale.md): 10 nodes x 10,000 sessions unless
# FLEET says otherwise, e.g. FLEET='--curve 3x1000,5x5000,10x10000'; niced (a
# shared machine). `make test` runs 3 x 1,000 for correctness (tests/cluster/test_fleet.py).
.PHONY: bench-fleet
FLEET ?= --fleet-nodes 10 --sessions 10000
bench-fleet: $(STAMP)
	nice $(BIN)/python -m sessiond.bench.cluster --fleet $(FLEET)

# sessiond beside supervisord (installed into the venv for this), in one run.
compare: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m sessiond.bench.compare

# 1,000 concurrent clients for 30 s against 10,000 sessions with 50 running (~1 min).
load: $(STAMP)
	$(BIN)/python -m sessiond.bench.load

# Install as a system service (as root): a venv in PREFIX, the units, a config.
#   make install && systemctl daemon-reload && systemctl enable --now sessiond
PREFIX  ?= /opt/sessiond
UNITDIR ?= /etc/systemd/system
CONFDIR ?= /etc/sessiond
BINDIR  ?= /usr/local/bin
install:
	$(PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/python -m pip install --quiet .
	install -d -m 0755 $(UNITDIR) $(CONFDIR) $(CONFDIR)/sessions $(BINDIR)
	sed -e 's|/usr/local/bin/sessiond|$(PREFIX)/bin/sessiond|' \
	    -e 's|/etc/sessiond/sessiond.toml|$(CONFDIR)/sessiond.toml|' \
	    systemd/sessiond.service > $(UNITDIR)/sessiond.service
	install -m 0644 systemd/sessiond.socket $(UNITDIR)/sessiond.socket
	sed -e 's|/usr/local/bin/sessiond|$(PREFIX)/bin/sessiond|' \
	    -e 's|/etc/sessiond/%i.toml|$(CONFDIR)/%i.toml|' \
	    'systemd/sessiond@.service' > '$(UNITDIR)/sessiond@.service'
	test -f $(CONFDIR)/sessiond.toml || sed \
	    -e 's|^state_dir = .*|# state_dir: /var/lib/sessiond (the default as a service)|' \
	    -e 's|^socket = .*|# socket: /run/sessiond/sessiond.sock (the default as a service)|' \
	    config/sessiond.toml > $(CONFDIR)/sessiond.toml
	ln -sf $(PREFIX)/bin/sessiond $(BINDIR)/sessiond
	ln -sf $(PREFIX)/bin/sessionctl $(BINDIR)/sessionctl
	@echo "installed; now: systemctl daemon-reload && systemctl enable --now sessiond"

# Install for the current user: systemctl --user enable --now sessiond
USER_PREFIX ?= $(HOME)/.local/share/sessiond
install-user:
	$(PYTHON) -m venv $(USER_PREFIX)
	$(USER_PREFIX)/bin/python -m pip install --quiet .
	install -d $(HOME)/.local/bin $(HOME)/.config/systemd/user
	ln -sf $(USER_PREFIX)/bin/sessiond $(HOME)/.local/bin/sessiond
	ln -sf $(USER_PREFIX)/bin/sessionctl $(HOME)/.local/bin/sessionctl
	install -m 0644 systemd/user/sessiond.service $(HOME)/.config/systemd/user/sessiond.service
	@echo "installed; now: systemctl --user daemon-reload && systemctl --user enable --now sessiond"

clean:
	rm -rf $(VENV) state .demo-state .bench-work .mypy_cache .ruff_cache .pytest_cache .hypothesis

# The man pages, from the parsers (committed in man/; a test fails when they are stale).
man: $(STAMP)
	$(BIN)/python -m sessiond.manpages man
