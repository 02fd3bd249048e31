"""The database's clock as a process reads it (services/clock.py): once per anchor, then carried
forward, still the server's time. PostgreSQL only: on SQLite the local clock is the database's
and nothing is read."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from provisioning.services import clock
from provisioning.services.claims import DUE_SLACK

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite reads no clock: the local clock is the database's")
    clock.forget_anchor()


def _clock_reads(captured: list[dict[str, str]]) -> int:
    return sum("CLOCK_TIMESTAMP()" in q["sql"].upper() for q in captured)


def test_the_server_clock_is_read_once_per_anchor() -> None:
    # A step delivery asks for the time three times or more (claim, runner, journal).
    with CaptureQueriesContext(connection) as ctx:
        times = [clock.db_now() for _ in range(5)]
    assert _clock_reads(ctx.captured_queries) == 1
    assert times == sorted(times)


def test_the_carried_clock_is_the_servers_within_the_due_slack() -> None:
    clock.db_now()  # anchored
    before = clock.db_now()
    server = clock._server_clock()
    after = clock.db_now()
    assert before - DUE_SLACK <= server <= after + DUE_SLACK


def test_an_old_anchor_or_another_process_reads_the_clock_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock.db_now()
    monkeypatch.setattr(clock, "ANCHOR_SECONDS", 0.0)
    with CaptureQueriesContext(connection) as ctx:
        clock.db_now()
        clock.db_now()
    assert _clock_reads(ctx.captured_queries) == 2
    monkeypatch.setattr(clock, "ANCHOR_SECONDS", 30.0)
    clock.db_now()
    # A forked child (Celery's prefork pool) does not carry its parent's reading.
    monkeypatch.setattr(clock.os, "getpid", lambda: -1)
    with CaptureQueriesContext(connection) as ctx:
        clock.db_now()
        clock.db_now()
    assert _clock_reads(ctx.captured_queries) == 1
