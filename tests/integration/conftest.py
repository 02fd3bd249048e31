"""Fixtures of the integration tier: one real stack per session, real workers per test.

The tier needs PostgreSQL on 127.0.0.1:5432 (trust auth, user ``postgres``) and Redis on
127.0.0.1:6379; it is skipped with the reason when either does not answer. It creates its own
database ``proxyhub_it_<pid>`` and claims a Redis database no other run uses (``itstack.Services``;
``PROXYHUB_IT_REDIS_DB`` forces one), emptied before and after, so two runs on one machine never
take each other's messages.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import measured
import pytest
from itstack import Beat, Services, Stack, Worker, running_stack

# Timing knobs for every child process. Polls are short because the `fast` profile's tasks
# take 0.1-0.3 s. The step claim, the sweeper's interval and its grace are short (defaults: 20 s,
# 10 s, 10 s) so the kill and outage tests recover within seconds: on the defaults the tier ran
# a minute longer (161 s -> 228 s for its first ten tests). Issue 10's bound for recovery from
# killed workers is proven on the shipped defaults all the same, by
# test_fleet_delete_under_repeated_worker_kills, which runs its own worker and Beat schedule
# with these three unset. Reconcile runs every 5 s instead of every minute so the tests that
# need a round do not wait for one. GC's own Beat run is pushed out of the session so it cannot
# race the GC test, whose minimum age is ten minutes. Node health checks are pushed out too:
# their first Beat run falls due a minute after the migration, i.e. in whichever test has Beat
# running then, and fresh results switch placement from "fewest proxies" to "most free memory",
# which puts a whole fleet on the largest node (test_fleet_lifecycle expects a spread).
TIMINGS = {
    "PROXYHUB_POLL_INTERVAL_SECONDS": "0.2",
    "PROXYHUB_ADDRESS_POLL_SECONDS": "0.2",
    "PROXYHUB_STEP_CLAIM_SECONDS": "10",
    "PROXYHUB_SWEEPER_GRACE_SECONDS": "2",
    "PROXYHUB_SWEEPER_INTERVAL_SECONDS": "2",
    "PROXYHUB_RECONCILE_INTERVAL_SECONDS": "5",
    "PROXYHUB_GC_INTERVAL_SECONDS": "86400",
    "PROXYHUB_GC_MIN_AGE_SECONDS": "600",
    "PROXYHUB_HEALTH_INTERVAL_SECONDS": "86400",
}


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    services = Services.from_env()
    why = services.unavailable()
    if why:
        pytest.skip(f"the integration tier needs PostgreSQL and Redis: {why}")
    root = tmp_path_factory.mktemp("integration")
    with running_stack(
        root, services=services, database=f"proxyhub_it_{os.getpid()}", extra_env=TIMINGS
    ) as the_stack:
        yield the_stack


@pytest.fixture(scope="session")
def _main_worker(stack: Stack) -> Worker:
    return stack.worker("w1", concurrency=2)


@pytest.fixture
def worker(stack: Stack, _main_worker: Worker) -> Iterator[Worker]:
    """The session's worker (two prefork processes), running when the test starts.

    Afterwards every proxy a test left behind is deleted, so the next test starts on an idle
    worker and a simulator holding only its default guests and other tests' leftovers.
    """
    if not _main_worker.alive:
        _main_worker.start()
    yield _main_worker
    stack.sim.control("clear_faults")  # a failed test may have left latency behind
    if not _main_worker.alive:
        _main_worker.start()
    left = [row["name"] for row in stack.proxies()]
    if left:
        stack.manage("proxies", "delete", *left, check=False)
        stack.manage("proxies", "wait", *left, "--phase", "Deleted", "--timeout", "60", check=False)


@pytest.fixture
def second_worker(stack: Stack, worker: Worker) -> Iterator[Worker]:
    """Another worker instance (its own parent and pool) beside the session's one."""
    other = stack.worker("w2", concurrency=2)
    yield other
    other.stop()
    stack.workers.remove(other)


@pytest.fixture
def beat(stack: Stack) -> Iterator[Beat]:
    """``celery beat`` for this test only: the sweeper every 2 s, reconcile every 5 s, node
    checks on their own schedule (tests that count requests in a window run without it)."""
    the_beat = stack.beat()
    yield the_beat
    the_beat.stop()
    stack.beats.remove(the_beat)


@pytest.fixture
def measure(request: pytest.FixtureRequest, stack: Stack, tmp_path: Path) -> measured.Measure:
    """Record a figure (see ``measured``): ``measure("what", 12.3, "s", fleet=10)``."""

    def record(what: str, value: float, unit: str, **context: Any) -> None:
        entry = {"test": request.node.name, "what": what, "value": round(value, 2), "unit": unit}
        measured.record(
            {**entry, **context},
            tmp_path / "measurements.json",
            stack.logdir / "measurements.json",
        )

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if measured.SESSION:
        terminalreporter.section("integration measurements")
        for entry in measured.SESSION:
            context = {k: v for k, v in entry.items() if k not in ("test", "what", "value", "unit")}
            terminalreporter.write_line(
                f"{entry['what']}: {entry['value']} {entry['unit']}  ({entry['test']}; {context})"
            )
