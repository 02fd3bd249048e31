# proxyhub developer commands. `make test` is what CI runs (.ci/run calls it).
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-long test-real audit lint typecheck pytest pytest-postgres integration \
	integration-shared integration-restarts e2e lane-sqlite lane-postgres lane-wait sim clean

# PostgreSQL for the second run of the service tests (pytest-django creates test_<name>).
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
FAST   := -m "not integration and not e2e"

# The venv is rebuilt whenever a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt requirements-otel.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

# Style, then the architecture's import rules (pyproject.toml [tool.importlinter],
# docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The django-stubs plugin imports proxyhub.settings.production, which refuses to load without a
# secret key, a sealing key or a metrics token, or with DJANGO_DEBUG on; throwaway keys and an
# open /metrics are enough to learn the models and apps.
typecheck: $(STAMP)
	DJANGO_SECRET_KEY=typecheck-only-not-a-secret DJANGO_DEBUG=false PROXYHUB_METRICS_PUBLIC=true \
	PROXYHUB_SEALING_KEYS=dHlwZWNoZWNrLW9ubHktbm90LWEtc2VjcmV0LWtleSE= $(BIN)/mypy

# Unit, HTTP and service tests on SQLite.
pytest: $(STAMP)
	$(BIN)/pytest $(FAST) $(PYTEST_ARGS)

# The service tests again on PostgreSQL: both databases are supported deployments.
pytest-postgres: $(STAMP)
	DATABASE_URL=$(PG_URL) $(BIN)/pytest tests/service $(FAST) $(PYTEST_ARGS)

# Real Redis broker, real celery worker processes, PostgreSQL, the HTTPS simulator. The tests
# that restart the machine's Redis and PostgreSQL (RESTARTS) run on their own, last: anything
# else using either server then would lose its connections, and they skip rather than do that.
RESTARTS := tests/integration/test_broker_and_database_loss.py

integration: $(STAMP)
	$(MAKE) --no-print-directory integration-shared
	$(MAKE) --no-print-directory integration-restarts

integration-shared: $(STAMP)
	$(BIN)/pytest tests/integration -m integration --ignore=$(RESTARTS) $(PYTEST_ARGS)

integration-restarts: $(STAMP)
	$(BIN)/pytest $(RESTARTS) -m integration $(PYTEST_ARGS)

# The admin in Debian's Chromium, driven by Playwright, with a real worker.
e2e: $(STAMP)
	$(BIN)/pytest tests/e2e -m e2e --tb=short $(PYTEST_ARGS)

# The whole suite: style and types first, then the test tiers in three lanes side by side, then
# the tests that restart the servers, alone. Two lanes compute (the fast tier on SQLite; the
# service tests on PostgreSQL, half of whose time is the server's); the third mostly waits (real
# workers and a browser spend their time on polls, countdowns and Beat intervals). Each run
# claims a Redis database of its own (tests/support/redis_claim.py) and a PostgreSQL database of
# its own name, so the lanes share nothing. -O prints each lane's output whole when it ends.
test: lint typecheck
	$(MAKE) --no-print-directory -j3 -O lane-sqlite lane-postgres lane-wait
	$(MAKE) --no-print-directory integration-restarts

lane-sqlite: $(STAMP)
	$(MAKE) --no-print-directory pytest

lane-postgres: $(STAMP)
	$(MAKE) --no-print-directory pytest-postgres

lane-wait: $(STAMP)
	$(MAKE) --no-print-directory integration-shared
	$(MAKE) --no-print-directory e2e
	$(MAKE) --no-print-directory bench-smoke BENCH_ARGS="--no-latest --out $$(mktemp -d)/suite-smoke.json"

# The control loop's state machine (tests/service/test_state_machine.py) searched for longer than
# make test does: hundreds of random examples instead of the bounded, derandomized ones, on
# SQLite then PostgreSQL. Failing examples are kept in .hypothesis/ and tried first next time.
# About ten minutes; run it after changing the driver, reconcile, GC, the sweeper or leases.
test-long: $(STAMP)
	PROXYHUB_STATEMACHINE=long $(BIN)/pytest tests/service/test_state_machine.py $(PYTEST_ARGS)
	PROXYHUB_STATEMACHINE=long DATABASE_URL=$(PG_URL) $(BIN)/pytest tests/service/test_state_machine.py $(PYTEST_ARGS)

# The provider's lifecycle (tests/real) against the real Proxmox VE the PROXMOX_TEST_* variables
# name (docs/operator-guide.md, section 13); make test runs the same tests against the simulator.
# Everything a run makes is named proxy-phtest-* and removed when each test ends.
test-real: $(STAMP)
	@test -n "$$PROXMOX_TEST_URL" || { echo "set PROXMOX_TEST_URL and the other PROXMOX_TEST_* variables (docs/operator-guide.md, section 13)" >&2; exit 2; }
	$(BIN)/pytest tests/real -rs $(PYTEST_ARGS)

# Every pin of the requirements files against published advisories (bin/audit, pip-audit). Exits
# 0 clean, 1 with advisories, 2 when the vulnerability database could not be reached (it says
# which packages went unchecked). Not part of make test: it needs the database's host.
# docs/dependencies.md says when and how pins move.
audit: $(STAMP)
	$(BIN)/python bin/audit $(AUDIT_ARGS)

# proxyhub on this machine: migrate SQLite, start the simulator and import its catalogue,
# create the admin user and print its login, then web, a worker and Beat until Ctrl-C
# (bin/run-local; options through RUN_ARGS, e.g. RUN_ARGS="--web-port 8001").
run: $(STAMP)
	$(BIN)/python bin/run-local $(RUN_ARGS)

# The Proxmox simulator on its own, for poking at it with curl.
sim: $(STAMP)
	$(BIN)/python -m pvesim --profile fast --workdir var/pvesim

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Benchmarks. `make bench` runs issue 12's suite (benchmarks/suite.py)
# at full size: nine figures against their goals, floors and spread, merged into
# benchmarks/results/latest.json and printed as a table (benchmarks/README.md says how to read
# them). `make bench-smoke` runs the same suite at small sizes: a check that the harness works,
# recorded apart (`suite_smoke` in latest.json). `make test` runs it too (issue 12 asks for it in
# CI), last in the waiting lane, writing to a temporary file: no figure of it is asserted or
# kept, a harness that breaks fails the run. `make bench-fleet` runs the earlier benchmarks:
# requests per create/delete of the bare provider, fleet create time against the simulator's
# floor, a fleet under a storm of transient faults, a good cluster beside an unreachable one
# (about 15 minutes). All need PostgreSQL and Redis on 127.0.0.1, like the integration tier.
.PHONY: bench bench-smoke bench-fleet
bench: $(STAMP)
	$(BIN)/python benchmarks/suite.py --size full $(BENCH_ARGS)

bench-smoke: $(STAMP)
	$(BIN)/python benchmarks/suite.py --size smoke $(BENCH_ARGS)

bench-fleet: $(STAMP)
	$(BIN)/python benchmarks/provider_requests.py
	$(BIN)/python benchmarks/fleet.py $(FLEET_ARGS)
	$(BIN)/python benchmarks/faults.py
	$(BIN)/python benchmarks/isolation.py
