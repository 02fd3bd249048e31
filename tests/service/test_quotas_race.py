"""Two declarations at once on one cluster cannot both pass a limit only one of them fits in.

PostgreSQL only: it is where two connections really run side by side (SQLite admits one writer
at a time, so the race cannot happen there). The first declaration holds its transaction open
until the second is seen waiting on the cluster row's lock; without that lock the second would
count the rows committed so far, find room, and both would be written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, transaction
from pump import Pump, Sim, proxy_spec

from provisioning.models import Cluster, Operation, Proxy
from provisioning.services import operations
from provisioning.services.quotas import QuotaExceeded

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 30.0  # seconds; a bound on waiting for the other thread, not a timing assertion


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        (count,) = cursor.fetchone()
    return int(count)


def _thread(work: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        finally:
            connection.close()  # each thread has its own connection

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("limits", "refusal"),
    [
        ({"max_proxies": 3}, "(maxProxies); it holds 3 and this request adds 1"),
        (
            {"max_concurrent_creates": 3},
            "(maxConcurrentCreates); 3 are in flight and this request adds 1",
        ),
    ],
)
def test_a_declaration_waits_for_the_one_before_and_then_sees_it(
    pump: Pump, sim: Sim, limits: dict[str, int], refusal: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs two concurrent connections (PostgreSQL)")
    Cluster.objects.filter(pk=sim.cluster.pk).update(**limits)
    sim.cluster.refresh_from_db()
    holding, release = threading.Event(), threading.Event()
    outcome: dict[str, str] = {}

    def first() -> None:
        with transaction.atomic():
            operations.proxies_create(specs=[proxy_spec(sim, f"a{i}") for i in range(3)])
            holding.set()
            release.wait(DEADLINE)
        outcome["first"] = "created"

    def second() -> None:
        holding.wait(DEADLINE)
        try:
            operations.proxies_create(specs=[proxy_spec(sim, "b")])
            outcome["second"] = "created"
        except QuotaExceeded as err:
            outcome["second"] = "; ".join(err.messages)

    threads = [_thread(first), _thread(second)]
    assert holding.wait(DEADLINE)
    give_up = time.monotonic() + DEADLINE
    while _lock_waiters() == 0:  # the second declaration is blocked on the cluster's row
        assert time.monotonic() < give_up, "the second declaration never waited on a lock"
        time.sleep(0.05)
    release.set()
    for thread in threads:
        thread.join(DEADLINE)
    assert outcome["first"] == "created"
    assert refusal in outcome["second"]
    assert sorted(Proxy.objects.values_list("name", flat=True)) == ["a0", "a1", "a2"]
    assert Operation.objects.count() == 3
