# proxyhub developer commands. `make test` is what CI runs (.ci/run calls it).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck pytest sim clean

# The venv is rebuilt whenever a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# The whole suite: style, types, then every test tier.
test: lint typecheck pytest

# proxyhub on this machine: migrate SQLite, start the simulator and import its catalogue,
# create the admin user and print its login, then web, a worker and Beat until Ctrl-C
# (bin/run-local; options through RUN_ARGS, e.g. RUN_ARGS="--web-port 8001").
run: $(STAMP)
	$(BIN)/python bin/run-local $(RUN_ARGS)

# The Proxmox simulator on its own, for poking at it with curl.
sim: $(STAMP)
	$(BIN)/python -m provisioning.proxmox.simulator --profile fast --workdir var/pvesim

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
