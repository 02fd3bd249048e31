"""A worker keeps its PostgreSQL session from one step delivery to the next (issue 12).

With one worker process a fleet's makespan is the sum of its deliveries, and Celery's Django
fixup closes the database connection around every task unless told otherwise: each delivery
then opened a session of its own (a server process, authentication, cold catalog caches), a
tenth of its time. ``proxyhub.celery`` keeps the connection as Django keeps a request's
(``CONN_MAX_AGE``, health-checked), so sessions are counted here against deliveries.

Counted by the server itself (``pg_stat_database.sessions``, every session opened on the
stack's database) while only the worker works: the create command has returned, and this test
watches the journal on a connection it opened before the count starts.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from itstack import Stack, Worker, wait_until

pytestmark = pytest.mark.integration

STEP_SUCCEEDED = ("proxyhub.provisioning.step", " succeeded in ")


def _sessions(conn: psycopg.Connection, database: str) -> int:
    # A new snapshot for each read: within one it would repeat the first value it saw.
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def _deliveries(worker: Worker, offset: int) -> int:
    with open(worker.log, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    return sum(all(part in line for part in STEP_SUCCEEDED) for line in text.splitlines())


def test_step_deliveries_reuse_the_workers_database_session(stack: Stack, worker: Worker) -> None:
    url = stack.env["DATABASE_URL"]
    database = url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(url, autocommit=True) as watch:
        stack.create_proxies("keep-db-1", "keep-db-2")
        offset = worker.log.stat().st_size
        before = _sessions(watch, database)

        def finished() -> bool:
            row = watch.execute(
                "SELECT count(*) FROM provisioning_operation o JOIN provisioning_proxy p"
                " ON p.id = o.proxy_id WHERE p.name LIKE %s AND o.finished_at IS NULL",
                ("keep-db-%",),
            ).fetchone()
            return row is not None and row[0] == 0

        wait_until(finished, timeout=180, interval=0.5, what="the two creates to end")
        time.sleep(1.5)  # a closed session's count reaches the server's statistics on exit
        opened = _sessions(watch, database) - before
    deliveries = _deliveries(worker, offset)
    # Each of the worker's two pool processes may open one (and a claim kept alive by its
    # renewal thread another); one per delivery was the defect.
    assert deliveries >= 10, deliveries
    assert opened <= deliveries // 4, (opened, deliveries)
