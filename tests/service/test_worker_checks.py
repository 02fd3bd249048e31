"""A worker at start: the checks it runs (all but the console's and manage.py's, which would
import them) and the console it does not load, nor cryptography (loaded where a value is sealed,
opened or a CA file read: a worker's parent does none of it, issue 12)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from conftest import _run

from proxyhub.worker_checks import NOT_WORKER_TAGS, run_worker_checks, worker_check_tags

# What a worker at start does: Celery's loader starts the worker (its Django fixup sets Django
# up, and runs the checks unless told not to), then proxyhub's worker_init checks; then which
# modules of the console and of manage.py got imported.
_WORKER_START = """
import json, sys
from proxyhub.celery import app
app.loader.init_worker()
from proxyhub.worker_checks import run_worker_checks
found = run_worker_checks()
not_in_a_worker = [
    "proxyhub.urls", "proxyhub.twofactor.views", "qrcode", "pycdlib",
    "provisioning.admin", "healthchecks.admin", "proxyhub.twofactor.admin", "django_otp.admin",
    "django.core.management.commands.makemigrations",
    "cryptography.fernet", "cryptography.x509", "cryptography.hazmat.bindings._rust",
]
print("LOADED " + json.dumps([m for m in not_in_a_worker if m in sys.modules]))
"""

# A Celery process that loads the URLconf all the same: the console it serves is whole, and
# the authenticator admin is this project's, not django-otp's (which shows a device's key).
_WORKER_LOADS_URLS = """
import json
from proxyhub.celery import app
app.loader.init_worker()
import proxyhub.urls
from django.contrib import admin
from django_otp.plugins.otp_totp.models import TOTPDevice
from provisioning.models import Proxy
from healthchecks.models import NodeHealth
print("SITE " + json.dumps({
    "proxy": Proxy in admin.site._registry,
    "health": NodeHealth in admin.site._registry,
    "totp": type(admin.site._registry.get(TOTPDevice)).__module__,
}))
"""


def test_a_starting_worker_does_not_import_the_console(prod_env: dict[str, str]) -> None:
    done = _run(["-c", _WORKER_START], prod_env, timeout=60)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOADED "))
    assert json.loads(line.removeprefix("LOADED ")) == []


def test_a_worker_that_loads_the_urlconf_serves_the_whole_console(
    prod_env: dict[str, str],
) -> None:
    done = _run(["-c", _WORKER_LOADS_URLS], prod_env, timeout=60)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("SITE "))
    assert json.loads(line.removeprefix("SITE ")) == {
        "proxy": True,
        "health": True,
        "totp": "proxyhub.twofactor.admin",
    }


def test_the_worker_checks_are_all_but_the_console_and_command_ones() -> None:
    tags = set(worker_check_tags())
    assert {"celery", "proxyhub", "models", "database"} <= tags
    assert not tags & NOT_WORKER_TAGS


@pytest.mark.django_db
def test_a_worker_logs_an_unsafe_visibility_timeout(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 1}
    with caplog.at_level(logging.WARNING, logger="proxyhub.worker"):
        found = run_worker_checks()
    assert "proxyhub.E001" in {m.id for m in found}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [getattr(r, "check_id", None) for r in errors] == ["proxyhub.E001"]
