"""The browser tier: Debian's Chromium driven by Playwright against pytest-django's live server,
with a real ``celery`` worker process and the HTTPS simulator process behind it.

Processes and where they meet:

* the live server (a thread of this process) serves the admin and, through the services, sends
  step messages to the embedded broker (kombu's filesystem transport) in this test's folder;
* ``celery -A proxyhub worker`` (a child with an environment built from scratch, as a
  production process has) consumes that folder and drives the simulator;
* both use one database: the test database itself. On PostgreSQL that is ``test_<name>``; on
  SQLite a file copy of the in-memory test database, for this test only (``shared_database``),
  because a worker process cannot open an in-memory database.

The tests are marked ``e2e`` and skipped, with the reason, only when ``/usr/bin/chromium`` is
missing (``apt-get install chromium``).
"""

from __future__ import annotations

import json
import os
import selectors
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from e2e_stack import CHROMIUM, CHROMIUM_ARGS, REPO, SCREENSHOTS, Simulator, Worker, child_env, stop

# --- the database both processes share ------------------------------------------------------


@pytest.fixture
def shared_database(live_server: Any, tmp_path: Path) -> Iterator[str]:
    """The test database as a ``DATABASE_URL`` the worker process can open.

    PostgreSQL's test database is a server database already. pytest-django's SQLite test
    database lives in memory, which no other process can open, so for this test it is copied
    into a file (SQLite's online backup) and the connection, which the live server's thread
    shares with this one for an in-memory database, is pointed at the file. Afterwards the
    connection goes back to the in-memory database, which stayed open (closing it would
    destroy it).
    """
    from django.db import connection

    if connection.vendor != "sqlite" or not connection.is_in_memory_db():
        yield database_url()
        return
    path = tmp_path / "proxyhub-e2e.sqlite3"
    connection.ensure_connection()
    memory = connection.connection
    target = sqlite3.connect(path)
    memory.backup(target)
    target.close()
    saved = {key: connection.settings_dict[key] for key in ("NAME", "CONN_MAX_AGE")}
    # A persistent connection: the server thread closes a shared connection at the end of every
    # request otherwise (an in-memory one it never closes), pulling it from under this thread.
    connection.settings_dict.update(NAME=str(path), CONN_MAX_AGE=None)
    connection.connection = None  # the next query opens the file
    try:
        yield f"sqlite:///{path}"
    finally:
        connection.close()
        connection.settings_dict.update(saved)
        connection.connection = memory


def database_url() -> str:
    """A server test database as a ``DATABASE_URL`` for the worker."""
    from django.db import connection

    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    if connection.vendor == "postgresql":
        user = quote(str(params.get("USER") or ""), safe="")
        password = quote(str(params.get("PASSWORD") or ""), safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = params.get("HOST") or "127.0.0.1"
        port = params.get("PORT") or 5432
        return f"postgres://{auth}{host}:{port}/{params['NAME']}"
    pytest.fail(f"no DATABASE_URL for a {connection.vendor} test database")
    raise AssertionError  # unreachable: pytest.fail raises


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Simulator]:
    """``python -m pvesim`` over HTTPS, on a free port."""
    log = open(tmp_path / "simulator.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pvesim",
            "--port",
            "0",
            "--profile",
            "fast",
            "--workdir",
            str(tmp_path / "pvesim"),
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(30):
                pytest.fail(f"the simulator printed no ready line; see {log.name}")
        ready = json.loads(process.stdout.readline())
        yield Simulator(
            url=ready["url"],
            token_file=Path(ready["tokenFile"]),
            ca_file=Path(ready["caFile"]),
            catalogue=Path(ready["catalogue"]),
        )
    finally:
        stop(process)
        log.close()


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    """The embedded broker's folders for this test, for the live server's producer and the
    worker alike. The Celery app of this process is pointed at them (and put back after), so
    the messages the services send after commit reach the worker started below."""
    from proxyhub.celery import app

    var = tmp_path / "var"
    folders = {name: var / "broker" / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    options = {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
    }
    _reset_producers(app)
    _point(app, "filesystem://localhost/", "proxyhub.embedded_broker:Transport", options)
    try:
        yield var
    finally:
        _reset_producers(app)
        for key in _BROKER_KEYS:
            app.conf.pop(key, None)  # drops the override: the settings' value shows again


# The app reads its broker from Django's settings under the CELERY_ namespace: which spelling a
# connection consults differs between Celery releases (5.6 reads the namespaced key), so the
# fixture sets both.
_BROKER_KEYS = (
    "broker_url",
    "broker_transport",
    "broker_transport_options",
    "CELERY_BROKER_URL",
    "CELERY_BROKER_TRANSPORT",
    "CELERY_BROKER_TRANSPORT_OPTIONS",
)


def _point(app: Any, url: str, transport: str, options: dict[str, Any]) -> None:
    app.conf["broker_url"] = app.conf["CELERY_BROKER_URL"] = url
    app.conf["broker_transport"] = app.conf["CELERY_BROKER_TRANSPORT"] = transport
    app.conf["broker_transport_options"] = options
    app.conf["CELERY_BROKER_TRANSPORT_OPTIONS"] = options


def _reset_producers(app: Any) -> None:
    """Forget the connection pools so the next message uses the current broker settings."""
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def worker(
    shared_database: str, broker_dir: Path, tmp_path: Path, settings: Any
) -> Iterator[Worker]:
    """A real ``celery -A proxyhub worker`` on the test database and the broker folder.

    Its sealing keys are this process's, so it can open what the live server sealed; its polls
    are short because the ``fast`` simulator's tasks take tenths of a second.
    """
    extra = {
        "DATABASE_URL": shared_database,
        "PROXYHUB_VAR_DIR": str(broker_dir),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "PROXYHUB_SEALING_KEYS": ",".join(settings.PROXYHUB_SEALING_KEYS),
        "DJANGO_DEBUG": "false",
        "PROXYHUB_POLL_INTERVAL_SECONDS": "0.2",
        "PROXYHUB_ADDRESS_POLL_SECONDS": "0.5",
        "PROXYHUB_LOG_LEVEL": "INFO",
    }
    if getattr(settings, "PROXYHUB_SECRETS_KEY", ""):
        extra["PROXYHUB_SECRETS_KEY"] = settings.PROXYHUB_SECRETS_KEY
    log_path = tmp_path / "worker.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "proxyhub",
            "worker",
            "-Q",
            "provisioning,health,control",
            "--concurrency",
            "2",
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "INFO",
        ],
        cwd=REPO,
        env=child_env(
            DJANGO_SETTINGS_MODULE="e2e_worker_settings",
            PYTHONPATH=os.pathsep.join([str(REPO), str(Path(__file__).parent)]),
            **extra,
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    the_worker = Worker(process, log_path)
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log_path.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker did not start:\n{the_worker.tail()}")
            time.sleep(0.2)
        yield the_worker
    finally:
        stop(process)
        log.close()


# --- what the worker said, beside a failure -------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    """On a failure, add the worker's warnings and errors and the end of its log to the report.

    The browser flow's assertion says what the page showed; why the worker did not get there
    is in its log, in this test's temporary folder, which a CI run does not keep."""
    outcome = yield
    report = outcome.get_result()
    worker = item.funcargs.get("worker") if hasattr(item, "funcargs") else None
    if not report.failed or not isinstance(worker, Worker) or not worker.log.exists():
        return
    report.sections.append(("worker warnings and errors", worker.problems()))
    report.sections.append(("worker log, last lines", worker.tail()))


# --- the browser ---------------------------------------------------------------------------


@pytest.fixture
def browser_page() -> Iterator[Any]:
    """A Chromium page (1366x900).

    Playwright's sync API runs an event loop in this thread, so the test makes its database
    writes in fixtures set up before this one: an ORM call under that loop is refused by
    Django, and would open a connection of its own that the database teardown never closes.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        page = context.new_page()
        page.set_default_timeout(20_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()


@pytest.fixture
def screenshot() -> Callable[[Any, str], Path]:
    """``screenshot(page, "03-bulk-preview")`` saves the whole page under var/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
