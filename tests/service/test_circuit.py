"""Cluster isolation (issue 10): one unreachable cluster is deferred by its circuit breaker and
holds no worker, while another cluster's operations go on; the breaker shows on the cluster
page, the proxy list and at /metrics."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, transaction
from django.test import Client
from pump import HookedTransport, Pump, Sim, make_cluster

from provisioning.models import CircuitBreaker, CircuitState, Cluster, Operation, Proxy
from provisioning.models.choices import OperationState, Phase
from provisioning.proxmox.api import Call
from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.deadline import effective
from provisioning.proxmox.errors import ConnectFailed, RequestTimeout
from provisioning.services import circuit, operations
from provisioning.services.circuit_probe import ProbeResult, ProbeRun
from provisioning.services.clock import db_now
from provisioning.services.driver import operation_run_step
from provisioning.services.operations import ProxySpec
from provisioning.services.providers import use_transport_factory
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db


class Unreachable:
    """A cluster nobody answers for: every request is refused, and counted."""

    def __init__(self) -> None:
        self.sent = 0
        self.paths: list[str] = []
        self.up = False
        self.inner: Any = None

    def send(self, call: Call, *, deadline: Any) -> Any:
        self.sent += 1
        self.paths.append(call.path)
        if self.up and self.inner is not None:
            return self.inner.send(call, deadline=deadline)
        raise ConnectFailed(f"{call.method} {call.path}: connection failed (connection refused)")


@pytest.fixture
def dead(sim: Sim, settings: Any) -> Iterator[tuple[Cluster, Unreachable]]:
    """A second cluster, ``dead``, whose endpoint refuses every connection; ``pvesim`` is the
    simulator as usual."""
    settings.PROXYHUB_CIRCUIT_FAILURES = 3
    settings.PROXYHUB_CIRCUIT_OPEN_SECONDS = 0.5
    settings.PROXYHUB_STEP_BASE_BACKOFF_SECONDS = 0.01
    settings.PROXYHUB_STEP_MAX_BACKOFF_SECONDS = 0.02
    cluster = make_cluster("dead")
    gone = Unreachable()
    gone.inner = HookedTransport(sim.engine, {})

    def factory(config: Any) -> Any:
        return gone if config.name == "dead" else HookedTransport(sim.engine, sim.hooks)

    with use_transport_factory(factory, budgets=Budgets(poll_interval=0.02)):
        yield cluster, gone


def _open_breaker(cluster: Cluster, *, times_opened: int, last_error: str) -> None:
    """The breaker as an outage a minute ago left it: open for another minute."""
    CircuitBreaker.objects.create(
        cluster=cluster,
        state=CircuitState.OPEN,
        failures=5,
        opened_at=db_now(),
        retry_at=db_now() + timedelta(minutes=1),
        open_seconds=60,
        times_opened=times_opened,
        last_error=last_error,
    )


def _go_silent(gone: Unreachable, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``gone`` a host that accepts and never answers: each request waits out its timeout
    (5 s here, standing in for requestTimeoutSeconds' 30) or the caller's shorter bound. The
    probe's bound is 0.3 s. Returns the list the names of the calls sent are appended to."""
    monkeypatch.setattr("django.conf.settings.PROXYHUB_CIRCUIT_PROBE_SECONDS", 0.3, raising=False)
    calls: list[str] = []

    def silent(call: Call, *, deadline: Any) -> Any:
        calls.append(call.name)
        effective(deadline).sleep(5.0)
        raise RequestTimeout(f"{call.method} {call.path}: no answer in time (read timed out)")

    monkeypatch.setattr(gone, "send", silent)
    return calls


def _spec(cluster: Cluster, name: str) -> ProxySpec:
    return ProxySpec(
        name=name, cluster=cluster, machine_type="small", image="debian-13", zone="pve1"
    )


def test_an_unreachable_cluster_opens_its_breaker_and_its_steps_stop_trying(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable]
) -> None:
    cluster, gone = dead
    op = pump.call(operations.proxy_create, spec=_spec(cluster, "lost"))
    for _ in range(40):  # deliver until the breaker opens
        message = pump.queue.pop(0)
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
        if CircuitBreaker.objects.filter(pk=cluster.pk, state=CircuitState.OPEN).exists():
            break
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.OPEN and breaker.times_opened == 1
    assert "connection refused" in breaker.last_error
    op.refresh_from_db()
    attempts, sent = op.attempts, gone.sent
    # While it is open, deliveries are deferred: no request, no attempt counted.
    Operation.objects.filter(pk=op.pk).update(next_step_at=db_now())
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    op.refresh_from_db()
    assert gone.sent == sent and op.attempts == attempts
    assert op.last_error.startswith("deferred: cluster dead is unreachable")
    assert op.state != OperationState.FAILED


def test_a_probe_closes_the_breaker_once_the_cluster_answers_again(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable]
) -> None:
    cluster, gone = dead
    op = pump.call(operations.proxy_create, spec=_spec(cluster, "back"))
    deadline = time.monotonic() + 5
    while not CircuitBreaker.objects.filter(pk=cluster.pk, state=CircuitState.OPEN).exists():
        assert time.monotonic() < deadline
        message = pump.queue.pop(0)
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    gone.up = True  # the cluster answers again; the breaker's interval is half a second
    pump.run(timeout=30)
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.CLOSED and breaker.failures == 0
    assert Proxy.objects.get(name="back").phase == Phase.RUNNING


def test_another_cluster_goes_on_while_one_is_unreachable(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], settings: Any
) -> None:
    cluster, gone = dead
    lost = pump.call(operations.proxy_create, spec=_spec(cluster, "lost"))
    fine = [pump.call(operations.proxy_create, spec=_spec(sim.cluster, f"ok{i}")) for i in range(3)]
    # Run until the good cluster's creates are done and the dead one's breaker is open; the
    # lost create keeps being deferred.
    deadline = time.monotonic() + 30

    def going() -> bool:
        return (
            any(Operation.objects.get(pk=o.pk).state != OperationState.SUCCEEDED for o in fine)
            or not CircuitBreaker.objects.filter(pk=cluster.pk, state=CircuitState.OPEN).exists()
        )

    while going():
        assert time.monotonic() < deadline, "the good cluster was held up"
        message = min(pump.queue)
        pump.queue.remove(message)
        pause = message.due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert CircuitBreaker.objects.get(pk=cluster.pk).state != CircuitState.CLOSED
    lost.refresh_from_db()
    assert lost.state not in (OperationState.SUCCEEDED, OperationState.FAILED)
    # The dead cluster never answered, so it stayed cold: no step request reached it, only
    # probes, one GET /version each (sent again in place by the seam when refused, as every
    # read is): three refused in a row opened the breaker, then one per open interval, which
    # doubles (0.5 s, 1 s, 2 s...), however long the good cluster took.
    assert set(gone.paths) == {"/version"}, gone.paths
    probes = 3 + math.ceil(math.log2(1 + 30 / 0.5))
    assert gone.sent <= probes * (1 + settings.PROXYHUB_READ_RETRIES), gone.paths


def test_reconcile_skips_a_cluster_whose_breaker_is_open(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable]
) -> None:
    cluster, gone = dead
    proxy = Proxy(name="idle", cluster=cluster, machine_type="small", image="debian-13")
    proxy.set_cloud_init(b"")
    proxy.save()
    _open_breaker(cluster, times_opened=1, last_error="Proxmox unreachable")
    counts = pump.call(reconcile_round)
    assert counts["circuit_open"] == 1 and gone.sent == 0
    assert not Operation.objects.filter(proxy=proxy).exists()


def test_the_breaker_shows_on_the_cluster_page_the_proxy_list_and_metrics(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], admin_client: Client
) -> None:
    cluster, _ = dead
    _open_breaker(cluster, times_opened=2, last_error="Proxmox unreachable: connection refused")
    page = admin_client.get(f"/admin/provisioning/cluster/{cluster.pk}/change/").content.decode()
    assert "steps deferred until" in page and "connection refused" in page
    listing = admin_client.get("/admin/provisioning/cluster/").content.decode()
    assert "ph-bad" in listing and "open" in listing
    proxies = admin_client.get("/admin/provisioning/proxy/").content.decode()
    assert 'id="circuit-banner"' in proxies and "dead" in proxies
    metrics = Client().get("/metrics").content.decode()
    assert 'proxyhub_cluster_circuit_open{cluster="dead",state="open"} 1.0' in metrics
    assert 'proxyhub_cluster_circuit_open{cluster="pvesim",state="closed"} 0.0' in metrics
    assert 'proxyhub_cluster_circuit_times_opened{cluster="dead"} 2.0' in metrics


def test_one_costly_failure_opens_the_breaker_and_probes_are_one_short_request(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that accepts connections and never answers costs a whole request timeout per try:
    one such failure opens the breaker, and its probes are one cheap request each, never a step
    that could hold a worker for the full timeout."""
    from provisioning.services import circuit

    cluster, gone = dead
    monkeypatch.setattr(circuit, "COSTLY_FAILURE_SECONDS", 0.05)
    calls: list[str] = []

    def slow(call: Call, *, deadline: Any) -> Any:
        calls.append(call.name)
        time.sleep(0.06)
        raise RequestTimeout(f"{call.method} {call.path}: no answer in time (read timed out)")

    monkeypatch.setattr(gone, "send", slow)
    pump.call(operations.proxy_create, spec=_spec(cluster, "silent"))
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.OPEN and breaker.failures == 1
    assert calls == ["version"]  # the cold cluster's probe, once: timeouts are not retried
    # The breaker's time is up: the next delivery probes with one version request, which also
    # times out, and the breaker opens again for twice as long without running the step.
    CircuitBreaker.objects.filter(pk=cluster.pk).update(retry_at=db_now())
    Operation.objects.filter(proxy__name="silent").update(next_step_at=db_now())
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert calls == ["version", "version"]
    breaker.refresh_from_db()
    assert breaker.state == CircuitState.OPEN and breaker.open_seconds == 1.0  # 0.5 s doubled


def test_a_cluster_that_has_not_answered_lately_runs_one_step_at_a_time(
    pump: Pump, sim: Sim
) -> None:
    """A host that has just gone silent must hold one worker for a request timeout, not every
    worker: until the cluster answers, a second step of it waits while one runs."""
    first = pump.call(operations.proxy_create, spec=_spec(sim.cluster, "one"))
    second = pump.call(operations.proxy_create, spec=_spec(sim.cluster, "two"))
    assert not CircuitBreaker.objects.filter(pk=sim.cluster.pk).exists()  # never answered yet
    # The first step is running (its delivery holds the claim) when the second is delivered.
    Operation.objects.filter(pk=first.pk).update(
        claim_token="running", claim_expires_at=db_now() + timedelta(seconds=20)
    )
    (message,) = [m for m in pump.queue if m.operation_id == str(second.pk)]
    pump.queue.remove(message)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    second.refresh_from_db()
    assert second.started_at is not None and not second.steps.exists()  # deferred, not run
    (again,) = [m for m in pump.queue if m.operation_id == str(second.pk)]
    assert 0.4 < again.due - time.monotonic() <= 1.0
    # Once the cluster answered (the first step's success warms it), steps run side by side.
    Operation.objects.filter(pk=first.pk).update(claim_token="", claim_expires_at=None)
    pump.run()
    assert CircuitBreaker.objects.get(pk=sim.cluster.pk).last_success_at is not None
    Operation.objects.filter(pk=first.pk).update(
        claim_token="running", claim_expires_at=db_now() + timedelta(seconds=20)
    )
    third = pump.call(operations.proxy_create, spec=_spec(sim.cluster, "three"))
    (message,) = [m for m in pump.queue if m.operation_id == str(third.pk)]
    pump.queue.remove(message)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert third.steps.exists()  # warm: it ran beside the "running" one


def test_first_contact_with_a_silent_cluster_costs_one_short_probe_not_a_request_timeout(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster that has not answered lately (here: never) may have gone silent, and a silent
    host holds the worker for a whole request timeout (30 s by default) per request. So the
    first step of a cold cluster is preceded by one probe bounded by the probe's few seconds:
    a silent host costs that bound once and opens the breaker, and the step never runs."""
    cluster, gone = dead
    calls = _go_silent(gone, monkeypatch)
    pump.call(operations.proxy_create, spec=_spec(cluster, "silent"))
    message = pump.queue.pop(0)
    started = time.monotonic()
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    held = time.monotonic() - started
    assert calls == ["version"]  # the probe, and no step request behind it
    assert held < 2.0, f"the delivery held the worker {held:.1f} s"
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.OPEN and breaker.failures == 1
    op = Operation.objects.get(proxy__name="silent")
    assert op.attempts == 0 and not op.steps.exists()  # deferred: the outage is the cluster's
    assert "unreachable" in op.last_error


def test_reconcile_of_a_silent_cluster_costs_one_short_probe_not_a_request_timeout(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconcile lists every cluster each round; the listing of a cold cluster that went silent
    would hold its worker for a whole request timeout. It is probed first, like a step."""
    cluster, gone = dead
    proxy = Proxy(name="idle", cluster=cluster, machine_type="small", image="debian-13")
    proxy.set_cloud_init(b"")
    proxy.save()
    calls = _go_silent(gone, monkeypatch)
    started = time.monotonic()
    counts = pump.call(reconcile_round)
    held = time.monotonic() - started
    assert calls == ["version"] and held < 2.0, (calls, held)
    assert counts["unreachable"] == 1
    assert CircuitBreaker.objects.get(pk=cluster.pk).state == CircuitState.OPEN
    assert not Operation.objects.filter(proxy=proxy).exists()


def test_a_cold_cluster_that_answers_its_probe_runs_the_step_in_the_same_delivery(
    pump: Pump, sim: Sim
) -> None:
    """The probe of a cold cluster is one cheap request; when the cluster answers, the step runs
    right behind it, and a warm cluster is not probed again."""
    op = pump.call(operations.proxy_create, spec=_spec(sim.cluster, "warm"))
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert op.steps.exists()  # the step ran in the delivery that probed
    versions = [e for e in sim.engine.ledger.calls("GET", "GET /version")]
    assert len(versions) == 1
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert len(sim.engine.ledger.calls("GET", "GET /version")) == 1  # warm from then on


class SlowButAlive:
    """A cluster that answers every request, each after ``delay`` seconds."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay, self.calls = inner, delay, []  # type: ignore[var-annotated]

    def send(self, call: Call, *, deadline: Any) -> Any:
        self.calls.append(call.name)
        effective(deadline).sleep(self.delay)
        return self.inner.send(call, deadline=deadline)


def _wait_for(condition: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not _holds(condition):
        assert time.monotonic() < end, "the probe's thread never recorded its verdict"
        time.sleep(0.02)


def _holds(condition: Any) -> bool:
    """The condition, read again later when the probe's thread holds the table (SQLite's shared
    cache refuses a reader at once while a writer holds it)."""
    try:
        return bool(condition())
    except OperationalError:
        return False


@pytest.mark.django_db(transaction=True)
def test_a_silent_clusters_probe_holds_the_worker_only_for_the_wait_and_records_from_its_thread(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], settings: Any
) -> None:
    """The probe's bound (1 s here) is longer than the delivery's wait (0.1 s): the delivery
    defers its step and goes, the cluster is half open meanwhile (its other steps wait for this
    probe rather than send their own), and the probe's thread opens the breaker when the bound
    has passed without an answer."""
    cluster, gone = dead
    settings.PROXYHUB_CIRCUIT_PROBE_SECONDS = 1.0
    settings.PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS = 0.1
    calls: list[str] = []

    def silent(call: Call, *, deadline: Any) -> Any:
        calls.append(call.name)
        effective(deadline).sleep(30.0)
        raise RequestTimeout(f"{call.method} {call.path}: no answer in time (read timed out)")

    gone.send = silent  # type: ignore[method-assign]
    first = pump.call(operations.proxy_create, spec=_spec(cluster, "quiet-1"))
    second = pump.call(operations.proxy_create, spec=_spec(cluster, "quiet-2"))
    by_op = {m.operation_id: m for m in pump.queue}
    pump.queue.clear()
    started = time.monotonic()
    message = by_op[str(first.pk)]
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    held = time.monotonic() - started
    assert held < 0.8, f"the delivery held the worker {held:.2f} s"
    assert CircuitBreaker.objects.get(pk=cluster.pk).state == CircuitState.HALF_OPEN
    first.refresh_from_db()
    assert first.last_error == "deferred: cluster dead is being probed" and first.attempts == 0
    # The cluster's other step waits for that verdict: no second probe.
    message = by_op[str(second.pk)]
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert calls == ["version"]
    _wait_for(lambda: CircuitBreaker.objects.get(pk=cluster.pk).state == CircuitState.OPEN)
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.failures == 1 and breaker.open_seconds == 0.5  # the first interval
    assert "did not answer in time" in breaker.last_error
    assert not Operation.objects.filter(steps__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_a_slow_but_live_clusters_probe_closes_the_breaker_from_its_thread_and_the_step_runs(
    pump: Pump, sim: Sim, dead: tuple[Cluster, Unreachable], settings: Any
) -> None:
    """A cluster that answers after the delivery's wait but within the probe's bound is alive:
    the probe's thread records the answer, and the deferred step runs when it comes back."""
    cluster, gone = dead
    settings.PROXYHUB_CIRCUIT_PROBE_SECONDS = 1.0
    settings.PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS = 0.05
    slow = SlowButAlive(gone.inner, delay=0.3)
    gone.send = slow.send  # type: ignore[method-assign]
    op = pump.call(operations.proxy_create, spec=_spec(cluster, "slowpoke"))
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    op.refresh_from_db()
    assert not op.steps.exists()  # deferred while the probe was out
    _wait_for(lambda: CircuitBreaker.objects.get(pk=cluster.pk).state == CircuitState.CLOSED)
    assert CircuitBreaker.objects.get(pk=cluster.pk).last_success_at is not None
    gone.send = gone.inner.send  # type: ignore[method-assign]
    pump.run(timeout=30)
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert slow.calls == ["version"]  # warm from the thread's verdict on: no second probe


@pytest.mark.django_db(transaction=True)
def test_a_probe_verdict_that_meets_a_busy_breaker_row_is_recorded_once_the_row_frees(
    dead: tuple[Cluster, Unreachable],
) -> None:
    """The probe's thread writes its verdict while another connection holds the breaker's row (a
    reader's table lock on SQLite, which fails the write at once rather than waiting; a row lock
    on PostgreSQL, which makes it wait). The verdict is written once the row frees, and once:
    a CI run lost it to ``database table is locked`` and left the breaker half open."""
    cluster, _ = dead
    now = db_now()
    CircuitBreaker.objects.create(
        cluster=cluster, state=CircuitState.HALF_OPEN, retry_at=now + timedelta(minutes=1)
    )
    silent = ProbeResult(error=RequestTimeout("GET /version: no answer in time"), seconds=1.0)
    writer = threading.Thread(
        target=circuit._record_on_probe_thread, args=(cluster.pk, cluster.name, 1.0, silent)
    )
    with transaction.atomic():
        held = CircuitBreaker.objects.select_for_update().get(pk=cluster.pk)
        assert held.state == CircuitState.HALF_OPEN
        writer.start()
        time.sleep(0.4)
    writer.join(timeout=10)
    assert not writer.is_alive()
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.OPEN
    assert breaker.failures == 1 and breaker.times_opened == 0


class WorkerDied(BaseException):
    """The worker process died here (nothing in proxyhub catches a ``BaseException``)."""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lost", ["with its delivery", "after the hand-off"])
def test_a_probe_lost_with_its_worker_holds_the_clusters_steps_for_the_probes_bound_not_a_minute(
    pump: Pump,
    sim: Sim,
    dead: tuple[Cluster, Unreachable],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    lost: str,
) -> None:
    """A worker killed while its probe was out leaves the breaker half open with nobody to write
    the verdict. The cluster's other steps wait for the verdict of a probe, so they must not
    wait longer than a probe can take (its bound, the verdict's write retries and a grace): the
    control-loop search once saw a delete wait out a whole minute after such a kill, though the
    cluster had answered again all along.

    ``with its delivery``: the breaker was open and this delivery won the probe; the worker dies
    during the probe's request. ``after the hand-off``: a cold cluster's probe outlived the
    delivery's wait and went on on its thread; the process dies before it reports."""
    cluster, gone = dead
    settings.PROXYHUB_CIRCUIT_PROBE_SECONDS = 0.3
    handing_off = ProbeRun.hand_off
    if lost == "with its delivery":
        _open_breaker(cluster, times_opened=1, last_error="GET /version: connection refused")
        CircuitBreaker.objects.filter(pk=cluster.pk).update(retry_at=db_now())

        def dies(call: Call, *, deadline: Any) -> Any:
            raise WorkerDied(call.path)

        gone.send = dies  # type: ignore[method-assign]
    else:
        settings.PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS = 0.05
        gone.send = SlowButAlive(gone.inner, delay=0.2).send  # type: ignore[method-assign]
        # The process dies with the probe's thread: no verdict is ever written.
        monkeypatch.setattr(ProbeRun, "hand_off", lambda self, then: None)
    orphan = pump.call(operations.proxy_create, spec=_spec(cluster, "orphan"))
    waiting = pump.call(operations.proxy_create, spec=_spec(cluster, "waiting"))
    by_op = {m.operation_id: m for m in pump.queue}
    pump.queue.clear()
    message = by_op[str(orphan.pk)]
    if lost == "with its delivery":
        with pytest.raises(WorkerDied):
            pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    else:
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
        monkeypatch.setattr(ProbeRun, "hand_off", handing_off)
    breaker = CircuitBreaker.objects.get(pk=cluster.pk)
    assert breaker.state == CircuitState.HALF_OPEN and breaker.retry_at is not None
    held = (breaker.retry_at - breaker.changed_at).total_seconds()
    assert held < 3.0, f"a lost probe holds the cluster {held:.1f} s"
    # The cluster answers again; its other step runs once the lost probe's time has passed.
    gone.send = gone.inner.send  # type: ignore[method-assign]
    pump.queue.append(by_op[str(waiting.pk)])
    pump.run(timeout=15)
    waiting.refresh_from_db()
    assert waiting.state == OperationState.SUCCEEDED, waiting.last_error
    assert CircuitBreaker.objects.get(pk=cluster.pk).state == CircuitState.CLOSED
