"""Fixtures for running proxyhub the way an operator does: a fresh process, a clean environment.

Settings are read once per process from the environment, so whatever depends on environment
variables (production defaults, REDIS_URL, DATABASE_URL, the deploy checks) is tested in a child
process whose environment holds only what the test gives it. ``prod_env`` selects
``proxyhub.settings.production``, so the child is a production process, not one with the test
suite's settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pump import pump, sim  # noqa: F401  (the service tests' simulator and message pump)
from redis_broker import claimed_database, emptied

REPO = Path(__file__).resolve().parents[2]
# A key that satisfies security.W009 (50+ characters, 5+ distinct, no "django-insecure-").
# A Fernet key for production's required PROXYHUB_SEALING_KEYS, in child processes.
SEALING_KEY = "cHJvZC1lbnYtc2VhbGluZy1rZXktbm90LXNlY3JldCE="
STRONG_KEY = "pH7v-3kQz9TfWm2xLr8YcN4bJd6sAe1uGo5iK0tVhXyRwZqBnMjEaCsDfUgPlO"
# Production refuses to start without a /metrics token (or PROXYHUB_METRICS_PUBLIC=true).
METRICS_TOKEN = "metrics-bearer-4Qw9Zr2Lk7Xp3Vn8Tb6Hy1Jd5Fs0Gc"

# Runs inside the child: set Django up, GET each path with the test client, print JSON.
_PROBE = """
import json, sys
import django
django.setup()
from django.test import Client
client = Client()
out = []
for path in sys.argv[1:]:
    response = client.get(path)
    out.append({"path": path, "status": response.status_code,
                "content_type": response.get("Content-Type", ""),
                "location": response.get("Location", ""),
                "body": response.content.decode()})
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _no_estimates_kept() -> Iterator[None]:
    """A process keeps the estimates it read for a second (services.durations); each test has a
    database of its own, where the same cluster id may name another cluster."""
    from provisioning.services.durations import forget_estimates

    forget_estimates()
    yield
    forget_estimates()


@pytest.fixture(autouse=True)
def _installation_id_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test has a database of its own, so it gets its own installation identity file too
    (services.installation writes it when a fresh database first draws its identity). Patched
    on the settings object itself: an override_settings here would hide which settings module
    the run uses from the tests that check it."""
    from django.conf import settings

    monkeypatch.setattr(settings, "PROXYHUB_INSTALLATION_ID", "")
    monkeypatch.setattr(
        settings, "PROXYHUB_INSTALLATION_ID_FILE", str(tmp_path / "installation-id")
    )


@pytest.fixture
def prod_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a production process: DEBUG off, a real key, its own var directory."""
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "proxyhub.settings.production",
        "DJANGO_SECRET_KEY": STRONG_KEY,
        "PROXYHUB_SEALING_KEYS": SEALING_KEY,
        "DJANGO_ALLOWED_HOSTS": "proxyhub.example.com,testserver",
        "PROXYHUB_VAR_DIR": str(tmp_path / "var"),
        "PROXYHUB_METRICS_TOKEN": METRICS_TOKEN,
    }


def _run(
    args: list[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=dict(env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def manage() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``manage(env, "check", "--deploy")`` runs manage.py in a child with exactly ``env``."""

    def run(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return _run(["manage.py", *args], env, timeout=60)

    return run


@pytest.fixture
def python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``python(env, "-c", SCRIPT)`` runs the interpreter in a child with exactly ``env`` (a
    fresh process, as a management command or a worker is)."""

    def run(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return _run(list(args), env, timeout=60)

    return run


@pytest.fixture
def probe() -> Callable[..., list[dict[str, Any]]]:
    """``probe(env, "/readyz")`` GETs paths in a child with exactly ``env``; one dict per path."""

    def run(env: Mapping[str, str], *paths: str) -> list[dict[str, Any]]:
        done = _run(["-c", _PROBE, *paths], env, timeout=60)
        assert done.returncode == 0, done.stderr
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("PROBE "))
        return json.loads(line.removeprefix("PROBE "))

    return run


@pytest.fixture(scope="session")
def live_broker() -> Iterator[str]:
    """The URL of this run's own Redis database (redis_broker.claimed_database), for the tests
    that must see what is really published; claimed on first use."""
    yield from claimed_database()


@pytest.fixture
def live_queue(live_broker: str) -> Iterator[Any]:
    """A client of ``live_broker``'s database, emptied before and after the test."""
    yield from emptied(live_broker)


@pytest.fixture
def documented_credentials_dir(settings: Any) -> None:
    """The credentials directory of the documented deployment, /etc/proxyhub, for catalogues
    that name files the way DESIGN.md's example does (they need not exist)."""
    settings.PROXYHUB_CREDENTIALS_DIR = "/etc/proxyhub"


# --- the PostgreSQL run -------------------------------------------------------------------------

# pytest-django's fixtures that give a test the database; a test that uses none of them (directly
# or through its own fixtures) and carries no django_db mark never touches it.
_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
)


def _uses_the_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("django_db") or item.get_closest_marker("every_database"):
        return True
    return bool(_DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The second run of this tier (``make pytest-postgres``) exists to run the tests that touch
    the database on PostgreSQL; a test that never touches it would only repeat, result for
    result, what the SQLite run already did (a child process with an environment of its own, a
    settings check). It is left out there, so the run costs only what it adds. A test that reads the
    database's settings in this process without opening a connection says so with the
    ``every_database`` mark."""
    from django.conf import settings

    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        return
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        (kept if _uses_the_database(item) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
