"""The checks a worker runs at start: all but the web console's, which would import it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from conftest import _run

from proxyhub.worker_checks import WEB_ONLY_TAGS, run_worker_checks, worker_check_tags

# What a worker at start does: Celery's loader (its Django fixup runs the checks unless told
# not to), then proxyhub's worker_init checks; then which console modules got imported.
_WORKER_START = """
import json, sys
from proxyhub.celery import app
app.loader.import_default_modules()
from proxyhub.worker_checks import run_worker_checks
found = run_worker_checks()
console = ["proxyhub.urls", "proxyhub.twofactor.views", "qrcode", "pycdlib"]
print("LOADED " + json.dumps([m for m in console if m in sys.modules]))
"""


def test_a_starting_worker_does_not_import_the_console(prod_env: dict[str, str]) -> None:
    done = _run(["-c", _WORKER_START], prod_env, timeout=60)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOADED "))
    assert json.loads(line.removeprefix("LOADED ")) == []


def test_the_worker_checks_are_all_but_the_web_ones() -> None:
    tags = set(worker_check_tags())
    assert {"celery", "proxyhub", "models", "database"} <= tags
    assert not tags & WEB_ONLY_TAGS


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
