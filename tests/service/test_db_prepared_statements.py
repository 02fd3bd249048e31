"""A step delivery's statements are prepared on PostgreSQL, and only a step delivery's (issue 12;
services/prepared_statements.py). Checked on the server itself (``pg_prepared_statements``).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation
from provisioning.services import operations
from provisioning.services.prepared_statements import THRESHOLD, steps_prepared

pytestmark = pytest.mark.django_db


def _prepared(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall() if f'"{table}"' in row[0]]


def _read(times: int) -> None:
    for _ in range(times):
        list(Operation.objects.filter(kind="create").values_list("pk")[:1])


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (SQLite: test_the_block_is_a_no_op)")
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")


def test_a_statement_a_step_repeats_is_prepared_once(postgresql: None) -> None:
    raw = connection.connection
    before = (raw.cursor_factory, raw.prepare_threshold)
    with steps_prepared():
        _read(THRESHOLD)
        # Planned at every run up to the threshold.
        assert not _prepared("provisioning_operation")
        _read(2)
        prepared = _prepared("provisioning_operation")
    # One statement, its parameter bound by the server ($1), not written into its text.
    assert len(prepared) == 1, prepared
    assert "$1" in prepared[0] and "'create'" not in prepared[0], prepared
    # Outside the block the connection binds on the client again (bulk inserts of thousands of
    # rows pass the server's 65,535 parameters) and prepares nothing.
    assert (raw.cursor_factory, raw.prepare_threshold) == before
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    _read(THRESHOLD + 3)
    assert not _prepared("provisioning_operation")


def test_a_prepared_statement_is_still_logged_with_its_text(postgresql: None) -> None:
    """Django's debug cursor (DEBUG, CaptureQueriesContext) describes each statement; a
    prepared run's text came out None before the block told Django it binds on the server."""
    with steps_prepared(), CaptureQueriesContext(connection) as ctx:
        _read(THRESHOLD + 2)
    texts = [query["sql"] for query in ctx.captured_queries]
    assert len(texts) == THRESHOLD + 2
    assert all(t and '"provisioning_operation"' in t and "'create'" in t for t in texts), texts
    # Outside the block Django reads its settings again: client-side binding.
    assert connection.features.uses_server_side_binding is False


def test_a_create_s_step_deliveries_prepare_their_statements(
    postgresql: None, pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, f"p{i}") for i in range(2)])
    pump.run()
    # The claim, the operation's read and its update are among them; the journal's too.
    claims = [s for s in _prepared("provisioning_operation") if "claim_token" in s]
    assert claims and all("$1" in s for s in claims), claims
    assert _prepared("provisioning_operationstep")


def test_turned_off_nothing_is_prepared(
    postgresql: None, pump: Pump, sim: Sim, settings: Any
) -> None:
    """Behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode)."""
    settings.PROXYHUB_DB_PREPARED_STATEMENTS = False
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, f"p{i}") for i in range(2)])
    pump.run()
    assert not _prepared("provisioning_operation")
    assert not _prepared("provisioning_operationstep")


def test_the_block_is_a_no_op_on_sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite run's check")
    connection.ensure_connection()
    raw = connection.connection
    with steps_prepared():
        assert connection.connection is raw
        _read(THRESHOLD + 2)
    assert connection.connection is raw
