"""One clock for the control loop: the database's.

Due times, claims, leases, circuit timers and ages are written by one process and compared by
another, often on another machine. Comparing them with each host's own clock lets a worker a
few seconds behind drop countdown deliveries as "not due", or a fast one take a lease early.
Every such time is therefore read from the database server, which all processes share.

SQLite is an embedded file on one host: every process that opens it shares that host's clock, so
the local clock *is* the database's clock and no query is needed. PostgreSQL answers with
``clock_timestamp()``, the real time at the moment of the call (``now()`` would be frozen at the
start of the surrounding transaction).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database server's current time, timezone-aware (UTC)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            row = cursor.fetchone()
        assert row is not None
        value: datetime = row[0]
        return value.astimezone(UTC)
    return timezone.now()
