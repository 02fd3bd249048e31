"""A real Celery app on a real Redis for service tests that must see what is published.

``broker(url)`` makes the process's current Celery app one configured as settings make it for
a Redis ``REDIS_URL`` (``redis_transport_options``), on ``url``: the services' sends
(``current_app.send_task``) then really publish there. ``queue_messages`` reads back every
message waiting in a Redis database, decoded (Celery's message protocol 2), so a test can look
at kwargs and headers exactly as a worker would receive them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state
from django.conf import settings

from proxyhub.settings.base import redis_transport_options
from tests.support import redis_claim

REDIS_HOST = "redis://127.0.0.1:6379"


@contextmanager
def broker(url: str) -> Iterator[Celery]:
    """The current Celery app, for the block, is one on ``url`` (see the module docstring)."""
    app = Celery("proxyhub-broker-test", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(
        CELERY_BROKER_URL=url,
        # As the settings' Redis branch: the URL's scheme picks kombu's transport, not the
        # embedded broker's class that the test settings name (no REDIS_URL there).
        CELERY_BROKER_TRANSPORT=None,
        CELERY_BROKER_TRANSPORT_OPTIONS=redis_transport_options(
            settings.PROXYHUB_BROKER_TIMEOUT_SECONDS
        ),
    )
    previous = celery_state.get_current_app()
    app.set_current()
    try:
        yield app
    finally:
        previous.set_current()
        app.close()


def claimed_database() -> Iterator[str]:
    """The URL of a Redis database of the local server this run claimed for itself
    (``tests/support/redis_claim``: the SQLite and PostgreSQL runs of this tier and the
    integration tier run side by side), released at the end; skips without a server. Use as a
    session fixture's body: ``yield from claimed_database()``."""
    redis = pytest.importorskip("redis")
    try:
        with redis.Redis.from_url(f"{REDIS_HOST}/0", socket_connect_timeout=3) as client:
            client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    number = redis_claim.claim(REDIS_HOST)
    try:
        yield f"{REDIS_HOST}/{number}"
    finally:
        redis_claim.release(REDIS_HOST, number)


def emptied(url: str) -> Iterator[Any]:
    """A client of the claimed database at ``url``, emptied before and after the test (the
    claim stays). Use as a fixture's body: ``yield from emptied(live_broker)``."""
    import redis

    client = redis.Redis.from_url(url)
    redis_claim.empty(client)
    try:
        yield client
    finally:
        redis_claim.empty(client)
        client.close()


# kombu's Redis transport keeps a queue's messages of priority N > 0 in a list of their own,
# named the queue, this separator and N (kombu.transport.redis.Channel.sep).
PRIORITY_SEP = "\x06\x16"


def queue_messages(client: Any) -> list[dict[str, Any]]:
    """Every message waiting in any queue (Redis list) of the database: its queue, the priority
    list it waits in (``list``, ``priority``), headers, properties, args and kwargs, and the raw
    envelope as published."""
    found = []
    for key in client.keys("*"):
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            envelope = json.loads(raw)
            body = envelope["body"]
            if envelope["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args, kwargs, _ = json.loads(body)
            queue, _, level = key.decode().partition(PRIORITY_SEP)
            found.append(
                {
                    "queue": queue,
                    "list": key.decode(),
                    "priority": int(level or 0),
                    "task": envelope["headers"].get("task"),
                    "headers": envelope["headers"],
                    "properties": envelope["properties"],
                    "args": args,
                    "kwargs": kwargs,
                    "raw": raw.decode(),
                }
            )
    return found
