"""One clock for the control loop: the database's.

Due times, claims, leases, circuit timers and ages are written by one process and compared by
another, often on another machine. Comparing them with each host's own clock lets a worker a
few seconds behind drop countdown deliveries as "not due", or a fast one take a lease early.
Every such time is therefore read from the database server, which all processes share.

SQLite is an embedded file on one host: every process that opens it shares that host's clock, so
the local clock *is* the database's clock and no query is needed. PostgreSQL answers with
``clock_timestamp()``, the real time at the moment of the call (``now()`` would be frozen at the
start of the surrounding transaction).

A process reads the server's clock once and carries it forward on its own monotonic clock for
``ANCHOR_SECONDS`` before reading it again (issue 12: a step delivery asked three times, a
statement each). The value is still the server's time, off by at most the round trip of the
read that anchored it plus the local clock's drift over that span (parts per million, well
under the quarter second ``claims.DUE_SLACK`` allows); a wall-clock step on either host is
picked up at the next anchor, as the monotonic clock never jumps. A forked process (Celery's
prefork pool) anchors again: the parent's reading is not carried into the child.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

# How long one reading of the server's clock is carried forward before it is read again.
ANCHOR_SECONDS = 30.0


@dataclass(frozen=True)
class _Anchor:
    pid: int
    monotonic: float  # this process's monotonic clock when the server read its own
    server: datetime


_anchor: _Anchor | None = None


def db_now() -> datetime:
    """The database server's current time, timezone-aware (UTC)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    global _anchor
    anchor = _anchor
    mono = time.monotonic()
    if anchor is None or anchor.pid != os.getpid() or mono - anchor.monotonic > ANCHOR_SECONDS:
        server = _server_clock()
        after = time.monotonic()
        # The server read its clock somewhere between the two local readings: the middle is off
        # by at most half the round trip.
        anchor = _Anchor(os.getpid(), (mono + after) / 2, server)
        _anchor = anchor
        mono = after
    return anchor.server + timedelta(seconds=mono - anchor.monotonic)


def forget_anchor() -> None:
    """Read the server's clock again at the next ``db_now`` (tests)."""
    global _anchor
    _anchor = None


def _server_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value.astimezone(UTC)
