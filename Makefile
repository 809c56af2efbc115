# Loopline: two commands on a fresh machine — `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_SECONDS ?= 300
export DEMO_SECONDS

.PHONY: setup demo test test-fast images test-images gpu-bundle docs down status clean

# The virtual environment is rebuilt when pyproject.toml changes.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,test,train,docs]'
	touch $@

# Python packages, Debian packages (redis-server, kcat; as root) and the pinned Maven jars.
setup: $(BIN)/.installed
	$(BIN)/loopline stack setup

demo: setup
	$(BIN)/loopline demo --seconds $(DEMO_SECONDS)

# The tests start their own stack (own ports and data dir) and stop it at the end; the image tests run apart.
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -m "not images" --durations=40

# The unit tier: the tests that need no stack and run in seconds (tests/README.md), in under 3 minutes.
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -m "not stack and not slow and not images" --durations=10

# Container images (infra/images/catalog.py) built with podman, cached: IMAGES="KEY ..." builds those, IMAGES=--all
# every one (the trainer, several GB, only when asked).
IMAGES ?=
images: setup
	$(BIN)/python -m loopline.images $(IMAGES)

# The image tests (marker images): the scorer image against the local stack, the Flink image against a session cluster.
test-images: images
	$(BIN)/pytest -q -m images

# The wheels the GPU check needs that the GPU machine's image lacks, for its Python (GPU_PYTHON_VERSION, default 3.12),
# into .loopline/gpu-bundle: carried there, infra/gpu_check.sh installs them with no network.
gpu-bundle: setup
	PYTHON=$(BIN)/python infra/gpu_bundle.sh

# The documentation site (mkdocs.yml; its reference pages generated from the code) into site/, every warning an error.
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

down:
	$(BIN)/loopline stack down

status:
	$(BIN)/loopline stack status

clean: down
	rm -rf .loopline $(VENV)
