# Loopline: two commands on a fresh machine — `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_SECONDS ?= 300
export DEMO_SECONDS

.PHONY: setup demo test down status clean

# The virtual environment is rebuilt when pyproject.toml changes.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,train]'
	touch $@

# Python packages, Debian packages (redis-server, kcat; as root) and the pinned Maven jars.
setup: $(BIN)/.installed
	$(BIN)/loopline stack setup

demo: setup
	$(BIN)/loopline demo --seconds $(DEMO_SECONDS)

# The tests start their own stack (own ports and data dir) and stop it at the end.
test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q

down:
	$(BIN)/loopline stack down

status:
	$(BIN)/loopline stack status

clean: down
	rm -rf .loopline $(VENV)
