"""The control loop under races, faults and time (issue 10): each test reproduces one way the
loop broke the operator's promise, and holds once the loop is fixed. They run on SQLite and
again on PostgreSQL (``make pytest-postgres``), where row locks and READ COMMITTED make races
that SQLite's single writer hides.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from pump import Pump, Sim, running_fleet

from provisioning.models import Operation, Proxy
from provisioning.models.choices import DesiredPower, OperationKind, OperationState, Phase
from provisioning.proxmox.api import Call
from provisioning.proxmox.seed import seed_volid
from provisioning.services import operations
from provisioning.services.claims import claim_take
from provisioning.services.clock import db_now
from provisioning.services.leases import proxy_lease_take
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db

LISTING = "GET /cluster/resources"


def _fleet(pump: Pump, sim: Sim, count: int, prefix: str = "p") -> list[Proxy]:
    return running_fleet(pump, sim, count, prefix=prefix, zone="pve1")


def _vms_named(sim: Sim, name: str) -> list[dict[str, Any]]:
    return [e for e in sim.api.cluster_resources() if e.get("name") == name]


# --- 1. decisions on fresh state ---------------------------------------------------------------


def test_reconcile_keeps_a_shutdown_that_completes_while_its_listing_is_in_flight(
    pump: Pump, sim: Sim
) -> None:
    """Issue 10, break 1: reconcile took its snapshot, then listed; meanwhile the operator's
    shutdown ran to the end. The listing shows the VM stopped while the snapshot still says
    "on", and the old loop started the VM again and set ``desired_power`` back to on."""
    (proxy,) = _fleet(pump, sim, 1)

    def operator_shuts_down(_: Call) -> None:
        pump.call(operations.proxy_power, proxy=proxy, action="shutdown")
        pump.run()
        assert Proxy.objects.get(pk=proxy.pk).phase == Phase.STOPPED

    sim.before(LISTING, operator_shuts_down)
    pump.call(reconcile_round)
    pump.run()
    proxy.refresh_from_db()
    assert proxy.desired_power == DesiredPower.OFF
    assert proxy.phase == Phase.STOPPED
    (vm,) = _vms_named(sim, proxy.vm_name)
    assert vm["status"] == "stopped"
    assert not Operation.objects.filter(kind=OperationKind.START).exists()


def test_reconcile_never_supersedes_a_replace_that_started_after_its_snapshot(
    pump: Pump, sim: Sim
) -> None:
    """Break 1, second face: a replace asked for while the listing is in flight must run to the
    end; the old loop saw the old VM gone (or stopped) and superseded the fresh operation."""
    (proxy,) = _fleet(pump, sim, 1)
    Proxy.objects.filter(pk=proxy.pk).update(phase=Phase.PROVISIONING, ip=None)
    replaced: list[Operation] = []

    def operator_replaces(_: Call) -> None:
        replaced.append(pump.call(operations.proxy_replace, proxy=proxy))

    sim.before(LISTING, operator_replaces)
    pump.call(reconcile_round)
    pump.run()
    (op,) = replaced
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert Operation.objects.filter(state=OperationState.FAILED).count() == 0
    assert len(_vms_named(sim, proxy.vm_name)) == 1


def test_reconcile_does_not_create_again_what_an_operator_created_while_it_listed(
    pump: Pump, sim: Sim
) -> None:
    """Break 1, third face: the snapshot saw a proxy with no VM and no operation; while the
    listing was in flight the operator's "Provision or retry" ran to the end, and the old loop
    then sent another create after it."""
    late = Proxy(
        name="late", cluster=sim.cluster, zone="pve1", machine_type="small", image="debian-13"
    )
    late.set_cloud_init(b"")
    late.save()

    def operator_provisions(_: Call) -> None:
        pump.call(operations.proxy_retry, proxy=late)
        pump.run()
        assert Proxy.objects.get(pk=late.pk).phase == Phase.RUNNING

    sim.before(LISTING, operator_provisions)
    pump.call(reconcile_round)
    pump.run()
    assert Operation.objects.filter(kind=OperationKind.CREATE).count() == 1
    assert len(_vms_named(sim, "proxy-late")) == 1


# --- 2. every failure ends or heals --------------------------------------------------------------


def test_start_of_a_vm_destroyed_out_of_band_fails_at_once_then_the_proxy_is_recreated(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Issue 10, break 2: the VM of a stopped proxy is destroyed in Proxmox, then the operator
    starts the proxy. The old driver retried the start's not-found for ever."""
    (proxy,) = _fleet(pump, sim, 1)
    pump.call(operations.proxy_power, proxy=proxy, action="shutdown")
    pump.run()
    proxy.refresh_from_db()
    sim.api.destroy(proxy.node, proxy.vmid)
    sim.settle()

    start = pump.call(operations.proxy_power, proxy=proxy, action="start")
    pump.run(timeout=20)
    start.refresh_from_db()
    assert start.state == OperationState.FAILED
    assert "no longer exists" in start.last_error
    proxy.refresh_from_db()
    assert proxy.desired_power == DesiredPower.ON  # what the operator asked for stays

    pump.call(reconcile_round)
    pump.run()
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING and proxy.ip
    (vm,) = _vms_named(sim, proxy.vm_name)
    assert vm["status"] == "running"


# --- 3. an exclusive lease -----------------------------------------------------------------------


def _proxy_with_create(sim: Sim, name: str = "leased") -> tuple[Proxy, Operation]:
    proxy = Proxy(name=name, cluster=sim.cluster, machine_type="small", image="debian-13")
    proxy.set_cloud_init(b"")
    proxy.save()
    create = Operation.objects.create(
        kind=OperationKind.CREATE, proxy=proxy, proxy_name=proxy.name, cluster=sim.cluster
    )
    return proxy, create


def test_the_database_refuses_a_second_unfinished_operation_on_one_proxy(sim: Sim) -> None:
    """Break 3's root: a power action could start beside a create, so two operations contended
    for one lease. Now at most one operation per proxy is unfinished, by a constraint."""
    proxy, _ = _proxy_with_create(sim)
    with pytest.raises(IntegrityError), transaction.atomic():
        Operation.objects.create(
            kind=OperationKind.START, proxy=proxy, proxy_name=proxy.name, cluster=sim.cluster
        )


def test_the_lease_holder_keeps_it_through_its_own_backoff(pump: Pump, sim: Sim) -> None:
    """Break 3, second face: a create waiting out a long backoff lost its lease when the lease
    expired, and a power operation ran between its steps (a start before the seed ISO is
    attached boots a VM that never gets its address). Now the lease has no expiry, and power
    actions are refused while the proxy is being created."""
    proxy, create = _proxy_with_create(sim)
    assert proxy_lease_take(operation=create)
    Proxy.objects.filter(pk=proxy.pk).update(provider_id="vms/100001/proxy-leased", vmid=100001)
    Operation.objects.filter(pk=create.pk).update(
        state=OperationState.RUNNING,
        attempts=5,
        next_step_at=create.created_at + timedelta(hours=1),
        claim_token="",
        claim_expires_at=None,
    )
    proxy.refresh_from_db()
    with pytest.raises(ValidationError, match="being created"):
        operations.proxy_power(proxy=proxy, action="start")
    assert Proxy.objects.get(pk=proxy.pk).lease_operation_id == create.pk
    assert pump.call(reconcile_round)["busy"] == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="two writers need a server database; the in-memory SQLite test database has one",
)
def test_two_connections_racing_for_one_step_claim_never_both_win(sim: Sim) -> None:
    """The sweeper re-sends an overdue step with the same token, so two deliveries of one step
    may race. The claim's conditions sit on the row itself, which PostgreSQL re-checks after
    waiting for the row: exactly one delivery runs the step."""
    _, create = _proxy_with_create(sim, "claimed")
    Operation.objects.filter(pk=create.pk).update(dispatch_token="t0k3n", next_step_at=None)
    barrier = threading.Barrier(2)
    results: list[str | None] = []
    errors: list[BaseException] = []

    def deliver() -> None:
        try:
            barrier.wait(5)
            with transaction.atomic():
                got = claim_take(operation_id=str(create.pk), token="t0k3n", now=db_now())
                results.append(got)
                time.sleep(0.3)  # hold the row: the other delivery waits on it
        except BaseException as err:
            errors.append(err)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sum(r is not None for r in results) == 1, results


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="two writers need a server database; the in-memory SQLite test database has one",
)
def test_a_delete_waits_for_the_lease_while_the_superseded_step_still_runs(sim: Sim) -> None:
    """Two connections: a create's delivery holds the proxy (its step is running) while the
    operator deletes the proxy from another. The delete supersedes the create at once, but its
    own first step must not take the lease until the create's running step is done."""
    proxy, create = _proxy_with_create(sim, "racing")
    now = db_now()
    Operation.objects.filter(pk=create.pk).update(
        state=OperationState.RUNNING, claim_token="c1", claim_expires_at=now + timedelta(minutes=1)
    )
    assert proxy_lease_take(operation=create)
    holding = threading.Event()
    seen: dict[str, Any] = {}
    errors: list[BaseException] = []

    def create_step_persists() -> None:
        try:
            with transaction.atomic():
                list(Proxy.objects.select_for_update().filter(pk=proxy.pk))
                holding.set()
                time.sleep(0.5)  # the operator's delete waits on the proxy row meanwhile
        except BaseException as err:
            errors.append(err)
            holding.set()
        finally:
            connection.close()

    def operator_deletes() -> None:
        try:
            holding.wait(5)
            delete = operations.proxy_request_delete(proxy=Proxy.objects.get(pk=proxy.pk))
            seen["delete"] = delete
            seen["while_running"] = proxy_lease_take(operation=delete)
        except BaseException as err:
            errors.append(err)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=create_step_persists),
        threading.Thread(target=operator_deletes),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert seen["while_running"] is False
    assert Operation.objects.get(pk=create.pk).state == OperationState.FAILED
    # The create's delivery ends (its persist releases the claim): the delete may go.
    Operation.objects.filter(pk=create.pk).update(claim_token="", claim_expires_at=None)
    assert proxy_lease_take(operation=seen["delete"])


# --- found by the state machine (test_state_machine.py) -----------------------------------------


def test_a_delete_removes_the_seed_an_earlier_vm_left_on_another_node(pump: Pump, sim: Sim) -> None:
    """The proxy's VM was destroyed outside proxyhub and reconcile created it again on another
    node. Seed 000 entry 11 deletes the seed on the VM's node only, so the first node's seed
    outlived the converged delete (the state machine's "nothing left after a delete"). The
    delete now also clears every node the journal shows a VM of the proxy created on."""
    (proxy,) = _fleet(pump, sim, 1)
    assert proxy.node == "pve1"
    sim.api.stop(proxy.node, proxy.vmid)
    sim.settle()
    sim.api.destroy(proxy.node, proxy.vmid)
    sim.settle()
    # Placement now chooses pve2 (as a zone-less proxy's placement may, after a node filled).
    Proxy.objects.filter(pk=proxy.pk).update(zone="pve2")
    pump.call(reconcile_round)
    pump.run()
    proxy.refresh_from_db()
    assert (proxy.phase, proxy.node) == (Phase.RUNNING, "pve2")

    pump.call(operations.proxy_request_delete, proxy=proxy)
    pump.run()
    assert not Proxy.objects.filter(pk=proxy.pk).exists()
    volid = seed_volid("proxy-seeds", proxy.vm_name)
    left = [n for n in ("pve1", "pve2", "pve3") if sim.engine.control.volume_data(n, volid)]
    assert left == []
