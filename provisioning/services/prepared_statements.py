"""PostgreSQL plans a step's statements once per connection, not at every delivery (issue 12).

A step is a dozen short statements (claim, read, journal, slots, estimate) whose texts are the
same on every delivery, and PostgreSQL spent more time planning them than running them: the
operation's read took 0.54 ms to plan and 0.23 ms to run. With the server binding the
parameters (``$1``), psycopg prepares a statement once its connection has run it
``THRESHOLD`` times, and the server reuses the plan. In the service tests' pump of twelve warm
creates a step's SQL went from 6.4 ms to 4.5-5.0 (the operation's read from 1.2 ms to 0.5);
benchmarks/README.md has what it did to the makespan.

Only for the block of a step delivery (``steps_prepared``), not for the whole process: Django's
client-side binding stays the rule elsewhere, because server-side binding limits a statement to
65,535 parameters, which a bulk insert of a thousand proxies passes (the admin's and the bulk
commands' paths), and the ORM does not promise that every query it builds can be prepared
(Django ticket #20516). A step's statements have a handful of parameters each.

``PROXYHUB_DB_PREPARED_STATEMENTS`` false turns it off: a pooler that cannot keep prepared
statements across transactions (PgBouncer in transaction mode before 1.21, or without
``max_prepared_statements``) would send a step's transaction a connection without them.
SQLite has no such thing; the block changes nothing there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection

# psycopg's own default: a statement is prepared at its sixth run on a connection, so one-off
# statements (an error's path, a rare stage) cost no server memory.
THRESHOLD = 5


def enabled() -> bool:
    return connection.vendor == "postgresql" and bool(
        getattr(settings, "PROXYHUB_DB_PREPARED_STATEMENTS", True)
    )


@contextmanager
def steps_prepared() -> Iterator[None]:
    """Within the block, this process's connection binds parameters on the server and prepares
    what it repeats; after it, the connection is as it was. A connection Django replaced inside
    the block (after an error) is a fresh one with Django's defaults, and is left so."""
    if not enabled():
        yield
        return
    # Django defines it only with psycopg 3 installed, which django-stubs do not model.
    from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
        ServerBindingCursor,
    )

    connection.ensure_connection()
    raw = connection.connection
    saved = (raw.cursor_factory, raw.prepare_threshold)
    raw.cursor_factory = ServerBindingCursor
    raw.prepare_threshold = THRESHOLD
    # Django describes a statement it logs (the debug cursor: DEBUG, a test's
    # CaptureQueriesContext) from psycopg's last client-side query, which a prepared run does
    # not set: its text came out None. With this flag, which Django derives from the settings
    # when the whole process binds on the server, it composes the text instead; the block says
    # the same for its own time, and deleting it lets the cached_property read the settings
    # again.
    features: Any = connection.features  # PostgreSQL's features; the stubs know only the base
    features.uses_server_side_binding = True
    try:
        yield
    finally:
        del features.uses_server_side_binding
        if connection.connection is raw and not raw.closed:
            raw.cursor_factory, raw.prepare_threshold = saved
