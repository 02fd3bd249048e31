"""Settings of the test suite: pytest selects this module (pyproject.toml,
``[tool.pytest.ini_options] DJANGO_SETTINGS_MODULE``).

pytest-django imports it before any conftest can set variables, so whatever a test run needs
and a developer's shell does not provide is a default here. Everything else is ``base``, so the
tests see production's values (DEBUG off, HSTS, secure cookies). Tests that need production
itself, or another environment, start a child process with ``DJANGO_SETTINGS_MODULE`` set
(tests/service/conftest.py ``prod_env``, the integration and browser tiers).
"""

from __future__ import annotations

import tempfile

from .base import *  # noqa: F403
from .base import env, metrics_dir

# Django needs a key and no test should depend on the shell providing one; fixed, so runs are
# reproducible.
SECRET_KEY = env.str(
    "DJANGO_SECRET_KEY", default="proxyhub-test-suite-key-4f9c2a7e81d3b6a05c9e2f71d8b3a6e4"
)

# Fixed, like SECRET_KEY: a test that rotates keys overrides this list itself.
PROXYHUB_SEALING_KEYS = env.list(
    "PROXYHUB_SEALING_KEYS", default=["c2VhbGluZy10ZXN0LWtleS1ub3QtYS1zZWNyZXQtMDE="]
)

# The test client speaks plain HTTP; a redirect would answer every request with a 301.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)

# Process-local metrics, so one test's counters are not another process's files; a test that
# wants the multiprocess mode sets PROMETHEUS_MULTIPROC_DIR itself.
PROMETHEUS_MULTIPROC_DIR = metrics_dir(default="")

# In-process service tests run inside one database transaction that a probe's own thread cannot
# see, so the probing delivery waits for every verdict itself. The thread's path is tested with
# a transactional database (tests/service/test_circuit.py) and by the real workers of the
# integration tier, which run production settings.
PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS = env.float("PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS", default=60.0)

# Tests keep their token and CA files in pytest's temporary directories, all under the system's
# temporary directory; tests of the confinement itself narrow it with override_settings.
# Fixed rather than read from the environment: a developer's own value must not decide what the
# suite may read.
PROXYHUB_CREDENTIALS_DIR = tempfile.gettempdir()

# One process runs every in-process test: a readiness verdict or an operations summary kept from
# one test would answer the next. Tests of the windows themselves set them (test_probe_windows.py).
PROXYHUB_READYZ_CACHE_SECONDS = env.float("PROXYHUB_READYZ_CACHE_SECONDS", default=0.0)
PROXYHUB_METRICS_SUMMARY_SECONDS = env.float("PROXYHUB_METRICS_SUMMARY_SECONDS", default=0.0)
