"""A Redis database of the machine's server, claimed by one test run for itself.

Several runs share the one Redis on 127.0.0.1:6379: ``make test`` runs the service tests on
SQLite and on PostgreSQL side by side with the integration tier, and a developer's run may sit
beside CI's. Two runs on one database would flush or take each other's messages, so a run
claims a database: an empty one, or one whose owner key names a process that no longer exists,
and marks it with its own ``host:pid``. The integration stack (``tests/integration/itstack.py``)
and the service tests that publish for real (``tests/service/redis_broker.py``) both claim
through here, and the test that restarts Redis reads the owner keys to know it is alone.
"""

from __future__ import annotations

import os
from typing import Any, cast

OWNER_KEY = "proxyhub-integration-owner"
# Every database but 0, which is left to whatever else uses the server by default.
CANDIDATES = tuple(range(15, 0, -1))


class NoFreeDatabase(RuntimeError):
    """Every candidate database is claimed by a live run or holds somebody else's data."""


def me() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """Whether ``host:pid`` is a live process (an owner on another host counts as alive)."""
    host, _, pid = owner.rpartition(":")
    if host != os.uname().nodename or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim(base: str, candidates: tuple[int, ...] = CANDIDATES, *, forced: bool = False) -> int:
    """Claim the first free database of ``candidates`` on the server at ``base`` and empty it
    (but for the owner key); ``forced``: take the one candidate even if it holds data."""
    import redis

    for db in candidates:
        client = redis.Redis.from_url(f"{base}/{db}", socket_connect_timeout=3)
        try:
            if _claim(client, forced=forced):
                return db
        finally:
            client.close()
    raise NoFreeDatabase(f"no free Redis database among {list(candidates)}")


def _claim(client: Any, *, forced: bool) -> bool:
    import redis

    with client.pipeline() as pipe:
        try:
            pipe.watch(OWNER_KEY)  # another run claiming at the same moment aborts us
            owner = cast("bytes | None", pipe.get(OWNER_KEY))
            if owner is not None and owner_alive(owner.decode()):
                return False
            if owner is None and pipe.dbsize() and not forced:
                return False  # somebody else's data
            pipe.multi()
            pipe.set(OWNER_KEY, me())
            pipe.execute()
        except redis.WatchError:
            return False
    empty(client)
    return True


def empty(client: Any) -> None:
    """Delete every key of the claimed database but its owner key: the claim stays."""
    for key in client.scan_iter(count=1000):
        if key != OWNER_KEY.encode():
            client.delete(key)


def release(base: str, db: int) -> None:
    """Empty the database, owner key included: it is free for the next run."""
    import redis

    client = redis.Redis.from_url(f"{base}/{db}", socket_connect_timeout=3)
    try:
        client.flushdb()
    finally:
        client.close()
