"""The broker restarted empty and the database restarted, each in the middle of ten creates.

research/reliability.md §5 items 8 and 9. Neither outage is announced to a worker: Redis comes
back with no queue at all (``shutdown nosave``, no persistence), so every step message queued,
reserved or waiting out a countdown is gone; PostgreSQL's fast restart drops every connection,
so a step that just submitted a clone may fail before it journals the UPID.

Recovery is the journal's in both cases (DESIGN.md §6): an operation whose due step nobody
claims is re-sent by Beat's sweeper with a new token, and the step resumes from what Proxmox
holds (seed 000 entry 10, "what a retry finds"). So the tests check, besides the end state
(every proxy Running, one VM per proxy by its mark's UID, one accepted clone per proxy in the
simulator's ledger, one succeeded create per proxy in the journal), that no operation stayed
overdue longer than one sweep interval plus slack once the service was back: the sweeper's
promise, measured by reading the journal's due times while the fleet converges.

Both servers are the machine's own, shared with anything else running on it, so each test
first waits for other users to go away and skips when they do not (``make test`` runs this
tier alone). The server is restarted in ``finally`` if it is not answering.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from itstack import CLONE, Beat, Services, Stack, Worker, wait_until

from tests.support import redis_claim

pytestmark = pytest.mark.integration

COUNT = 10
CLONE_PATH = CLONE.split(" ", 1)[1]
REDIS_START = [
    "redis-server",
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "--port",
    "6379",
    "--save",
    "",
    "--appendonly",
    "no",
]
# Beat's tick, the sweep task waiting for a free pool process, and this monitor's own sampling.
SLACK = 4.0


# --- the fleet ----------------------------------------------------------------------------------


def _create(stack: Stack, names: list[str]) -> None:
    stack.create_proxies(*names)


def _clones_applied(stack: Stack, after: int, prefix: str) -> int:
    return sum(
        e["status"] == 200 and str(e["params"].get("name", "")).startswith(f"proxy-{prefix}")
        for e in stack.sim.ledger(after=after, key=CLONE)
    )


def _mid_create(stack: Stack, names: list[str], prefix: str) -> int:
    """Submit the creates with clone replies held back, and return once some clones are applied
    (their replies still on the way) while the rest wait in the queue; returns the ledger seq
    the creates started after."""
    before = stack.sim.last_seq()
    stack.sim.control("latency", seconds=1.5, method="POST", path=CLONE_PATH)
    _create(stack, names)
    wait_until(
        lambda: _clones_applied(stack, before, prefix) >= 3,
        timeout=30,
        interval=0.05,
        what="three clones applied",
    )
    return before


def _assert_converged(stack: Stack, names: list[str], prefix: str, before: int) -> None:
    rows = {row["name"]: row for row in stack.proxies(prefix)}
    assert {n: rows[n]["phase"] for n in names} == dict.fromkeys(names, "Running")
    assert all(row["ip"] for row in rows.values())

    ours = [v for v in stack.sim.vms() if str(v.get("name", "")).startswith(f"proxy-{prefix}")]
    assert sorted(v["name"] for v in ours) == [f"proxy-{n}" for n in names]
    uids = Counter(
        line.removeprefix("proxyhub-uid=")
        for vm in ours
        for line in stack.sim.vm_config(vm["node"], vm["vmid"]).get("description", "").splitlines()
        if line.startswith("proxyhub-uid=")
    )
    assert uids == {row["uid"]: 1 for row in rows.values()}, "exactly one VM per proxy"

    # A clone whose reply was lost with the outage is found at its VMID, never sent again.
    accepted = Counter(
        e["params"]["name"]
        for e in stack.sim.ledger(after=before, key=CLONE)
        if e["status"] == 200 and str(e["params"].get("name", "")).startswith(f"proxy-{prefix}")
    )
    assert accepted == {f"proxy-{n}": 1 for n in names}, "no clone submitted twice"

    journal = stack.probe("journal", prefix)
    assert Counter((op["kind"], op["state"]) for op in journal) == {
        ("create", "succeeded"): len(names)
    }, "no operation lost or duplicated"


def _grace(stack: Stack) -> float:
    return float(stack.env["PROXYHUB_SWEEPER_GRACE_SECONDS"])


def _sweep_interval(stack: Stack) -> float:
    return float(stack.env["PROXYHUB_SWEEPER_INTERVAL_SECONDS"])


# --- how late the sweeper lets a step get -------------------------------------------------------


# An active operation nobody holds is due at its step time plus the grace, or when the claim of
# a delivery that died with the outage runs out; the sweeper re-sends it within one interval of
# that (services/sweeper.py). Lateness before the server was back is not the sweeper's.
LATENESS_SQL = """
SELECT count(*),
       coalesce(max(extract(epoch FROM now() - greatest(
           next_step_at + make_interval(secs => %(grace)s), claim_expires_at, %(since)s))), 0)
FROM provisioning_operation
WHERE proxy_name LIKE %(prefix)s
  AND state IN ('queued', 'running', 'waiting')
  AND (claim_expires_at IS NULL OR claim_expires_at < now())
"""


@dataclass
class LatenessMonitor:
    """Samples the journal's due times from a thread until the prefix has nothing unclaimed
    in flight; each sample on a fresh connection, so a database restart only loses samples."""

    database_url: str
    prefix: str
    grace: float
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    worst: float = 0.0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LatenessMonitor:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        params = {"grace": self.grace, "since": self.since, "prefix": f"{self.prefix}%"}
        while not self._stop.wait(0.25):
            try:
                with psycopg.connect(self.database_url, connect_timeout=2) as conn:
                    row = conn.execute(LATENESS_SQL, params).fetchone()
            except psycopg.Error:
                continue  # the server is restarting
            assert row is not None
            self.samples += 1
            self.worst = max(self.worst, float(row[1]))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


# --- the machine's servers ----------------------------------------------------------------------


def _wait_alone(check: Callable[[], str | None], timeout: float = 30.0) -> None:
    """Wait until ``check`` finds no other user of a server; skip the test when one stays."""
    deadline = time.monotonic() + timeout
    while (other := check()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if other:
        pytest.skip(f"cannot restart a server another run is using: {other}")


def _redis_db(stack: Stack) -> int:
    return int(urlsplit(stack.env["REDIS_URL"]).path.strip("/"))


def _redis_ping() -> bool:
    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _other_redis_user(ours: int) -> str | None:
    """Another integration run's claimed database, or a client on a database not ours."""
    for db in range(16):
        if db == ours:
            continue
        with redis.Redis(host="127.0.0.1", port=6379, db=db, socket_connect_timeout=3) as other:
            owner = cast("bytes | None", other.get(redis_claim.OWNER_KEY))
        if owner is not None and redis_claim.owner_alive(owner.decode()):
            return f"Redis database {db} is claimed by {owner.decode()}"
    with redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=3) as client:
        me = cast("int", client.client_id())
        clients = cast("list[dict[str, Any]]", client.client_list())
    for info in clients:
        if int(info["id"]) != me and int(info.get("db", 0)) != ours:
            return f"a Redis client on database {info.get('db')} ({info.get('addr')})"
    return None


def _start_redis() -> None:
    subprocess.run(REDIS_START, check=True, capture_output=True, timeout=30)
    wait_until(_redis_ping, timeout=30, what="Redis answering ping")


@contextlib.contextmanager
def _redis_restarted_empty(stack: Stack) -> Iterator[None]:
    """``shutdown nosave``, then the machine's start command: the broker comes back empty. The
    claim on our database is written again, so no other run takes it while we still use it."""
    try:
        subprocess.run(
            ["redis-cli", "-p", "6379", "shutdown", "nosave"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        wait_until(lambda: not _redis_ping(), timeout=30, what="Redis stopped")
        _start_redis()
        # No assertion that the database is empty: the workers' reconnect declares the queues at
        # once. Nothing survives anyway, the server runs without RDB or AOF (--save "").
        client = redis.Redis.from_url(stack.env["REDIS_URL"])
        client.set(redis_claim.OWNER_KEY, redis_claim.me())
        client.close()
        yield
    finally:
        if not _redis_ping():
            _start_redis()


def _pg_version() -> str:
    versions = sorted(p.name for p in Path("/etc/postgresql").iterdir() if p.name[0].isdigit())
    if not versions:
        pytest.skip("no local PostgreSQL cluster under /etc/postgresql to restart")
    return versions[-1]


def _pg_ready(admin_url: str) -> bool:
    try:
        with psycopg.connect(admin_url, connect_timeout=1):
            return True
    except psycopg.Error:
        return False


def _other_pg_user(admin_url: str, ours: str) -> str | None:
    with psycopg.connect(admin_url, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT datname, application_name FROM pg_stat_activity"
            " WHERE datname IS NOT NULL AND datname <> %s AND pid <> pg_backend_pid() LIMIT 1",
            (ours,),
        ).fetchone()
    return f"a session on database {row[0]} ({row[1] or 'no name'})" if row else None


@contextlib.contextmanager
def _postgres_restarted(admin_url: str) -> Iterator[None]:
    version = _pg_version()
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main"]
    try:
        subprocess.run([*command, "restart", "-m", "fast"], check=True, timeout=60)
        wait_until(lambda: _pg_ready(admin_url), timeout=30, what="PostgreSQL accepting")
        yield
    finally:
        if not _pg_ready(admin_url):
            subprocess.run([*command, "start"], check=False, timeout=60)
            wait_until(lambda: _pg_ready(admin_url), timeout=30, what="PostgreSQL accepting")


# --- the tests ----------------------------------------------------------------------------------


def test_redis_restarted_empty_mid_create_every_proxy_still_converges_once(
    stack: Stack, worker: Worker, second_worker: Worker, beat: Beat
) -> None:
    ours = _redis_db(stack)
    _wait_alone(lambda: _other_redis_user(ours))
    names = [f"bl-{i:02d}" for i in range(1, COUNT + 1)]

    before = _mid_create(stack, names, "bl-")
    with _redis_restarted_empty(stack):
        stack.sim.control("clear_faults")
        assert any(row["phase"] != "Running" for row in stack.proxies("bl-"))
        monitor = LatenessMonitor(stack.env["DATABASE_URL"], "bl-", _grace(stack)).start()
        try:
            # Nobody restarts a worker or Beat: they reconnect to the broker on their own.
            stack.wait_phase(names, "Running", timeout=60)
        finally:
            monitor.stop()
        assert worker.alive and second_worker.alive

    assert monitor.samples > 0
    assert monitor.worst <= _sweep_interval(stack) + SLACK, (
        f"an unclaimed step stayed {monitor.worst:.1f} s past due after the broker was back"
    )
    _assert_converged(stack, names, "bl-", before)


def test_postgres_restarted_mid_create_loses_and_duplicates_nothing(
    stack: Stack, worker: Worker, second_worker: Worker, beat: Beat
) -> None:
    services = Services.from_env()
    ours = urlsplit(stack.env["DATABASE_URL"]).path.strip("/")
    _wait_alone(lambda: _other_pg_user(services.pg_admin, ours))
    names = [f"dl-{i:02d}" for i in range(1, COUNT + 1)]

    before = _mid_create(stack, names, "dl-")
    with _postgres_restarted(services.pg_admin):
        stack.sim.control("clear_faults")
        monitor = LatenessMonitor(stack.env["DATABASE_URL"], "dl-", _grace(stack)).start()
        try:
            # Workers and Beat keep running: each task opens a connection if the last one died.
            stack.wait_phase(names, "Running", timeout=60)
        finally:
            monitor.stop()
        assert worker.alive and second_worker.alive

    assert monitor.samples > 0
    assert monitor.worst <= _sweep_interval(stack) + SLACK, (
        f"an unclaimed step stayed {monitor.worst:.1f} s past due after the database was back"
    )
    _assert_converged(stack, names, "dl-", before)
