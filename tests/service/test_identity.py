"""Seed 001's identity on the proxy: a VM destroyed and created again at the proxy's VMID with
its name and mark (what a restore from backup leaves) is detected on observation, on power and
on delete, shown on the proxy, and never acted on: the simulator's ledger shows no mutation.

Runs on SQLite and on PostgreSQL (``DATABASE_URL``), as every control-loop test does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pump import Pump, Sim, running_fleet, task_ended

from provisioning.models import Operation, Proxy
from provisioning.models.choices import ErrorClass, OperationKind, OperationState, Phase
from provisioning.proxmox.identity import identity_of
from provisioning.services import operations
from provisioning.services.clock import db_now
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db


def _restored(pump: Pump, sim: Sim, name: str) -> Proxy:
    """A running proxy whose VM is then re-created at its VMID behind proxyhub's back."""
    (proxy,) = running_fleet(pump, sim, 1, prefix=name, zone="pve1")
    config = sim.api.vm_config(proxy.node, int(proxy.vmid or 0))
    assert (proxy.smbios_uuid, proxy.vmgenid) == (
        identity_of(config).smbios_uuid,
        identity_of(config).vmgenid,
    )
    assert proxy.smbios_uuid and proxy.vmgenid
    sim.engine.control.recreate_vm(int(proxy.vmid or 0))
    sim.settle(1.0)  # pvestatd's lag: the listing shows it stopped
    sim.engine.ledger.clear()
    return proxy


def _shows_mismatch(proxy: Proxy) -> Proxy:
    fresh = Proxy.objects.get(pk=proxy.pk)
    assert fresh.phase == Phase.FAILED
    assert fresh.last_error_class == ErrorClass.IDENTITY
    assert "not the VM proxyhub made" in fresh.last_error
    assert "Accept the VM found" in fresh.last_error  # what to do
    assert fresh.smbios_uuid == proxy.smbios_uuid  # the record is kept, not overwritten
    return fresh


def test_observation_detects_a_recreated_vm_and_never_starts_it(pump: Pump, sim: Sim) -> None:
    proxy = _restored(pump, sim, "obs")
    pump.call(reconcile_round)
    pump.run()
    _shows_mismatch(proxy)
    # Another round leaves the latched proxy alone: no start, no recreate, no write.
    pump.call(reconcile_round)
    pump.run()
    assert sim.ledger_mutations() == []
    assert not Operation.objects.filter(proxy=proxy).exclude(kind=OperationKind.CREATE).exists()
    assert sim.api.vm_status(proxy.node, int(proxy.vmid or 0))["status"] == "stopped"


@pytest.mark.parametrize("action", ["start", "shutdown", "reboot"])
def test_a_power_action_is_refused_on_a_recreated_vm(pump: Pump, sim: Sim, action: str) -> None:
    proxy = _restored(pump, sim, f"pw{action[:2]}")
    if action == "shutdown":
        # Make the impostor run so a shutdown would have something to do.
        sim.api.start(proxy.node, int(proxy.vmid or 0))
        sim.settle(1.0)
        sim.engine.ledger.clear()
    op = pump.call(operations.proxy_power, proxy=proxy, action=action)
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.FAILED
    assert op.error_class == ErrorClass.IDENTITY
    _shows_mismatch(proxy)
    assert sim.ledger_mutations() == []


def test_a_delete_leaves_a_recreated_vm_and_keeps_the_proxy(pump: Pump, sim: Sim) -> None:
    proxy = _restored(pump, sim, "del")
    pump.call(operations.proxy_request_delete, proxy=proxy)
    pump.run()
    _shows_mismatch(proxy)
    assert sim.ledger_mutations() == []  # no stop, no destroy, no seed removed
    assert [e["vmid"] for e in sim.api.cluster_resources() if e.get("name") == proxy.vm_name] == [
        proxy.vmid
    ]


def test_a_retry_does_not_adopt_the_recreated_vm(pump: Pump, sim: Sim) -> None:
    proxy = _restored(pump, sim, "rty")
    pump.call(reconcile_round)
    pump.run()
    pump.call(operations.proxy_retry, proxy=Proxy.objects.get(pk=proxy.pk))
    pump.run()
    _shows_mismatch(proxy)
    assert sim.ledger_mutations() == []


def test_accepting_the_found_vm_adopts_it_and_records_its_identity(pump: Pump, sim: Sim) -> None:
    proxy = _restored(pump, sim, "acc")
    pump.call(reconcile_round)
    pump.run()
    _shows_mismatch(proxy)
    pump.call(operations.proxy_accept_vm, proxy=Proxy.objects.get(pk=proxy.pk))
    pump.run()
    fresh = Proxy.objects.get(pk=proxy.pk)
    found = identity_of(sim.api.vm_config(proxy.node, int(proxy.vmid or 0)))
    assert fresh.phase == Phase.RUNNING
    assert (fresh.smbios_uuid, fresh.vmgenid) == (found.smbios_uuid, found.vmgenid)
    assert fresh.smbios_uuid != proxy.smbios_uuid
    assert fresh.vmid == proxy.vmid  # adopted, not a new VM


def test_accept_is_refused_without_a_mismatch(pump: Pump, sim: Sim) -> None:
    from django.core.exceptions import ValidationError

    (proxy,) = running_fleet(pump, sim, 1, prefix="noacc", zone="pve1")
    with pytest.raises(ValidationError):
        operations.proxy_accept_vm(proxy=proxy)
    assert Proxy.objects.get(pk=proxy.pk).smbios_uuid == proxy.smbios_uuid


def test_a_proxy_from_before_identity_records_it_at_its_first_observation(
    pump: Pump, sim: Sim
) -> None:
    (proxy,) = running_fleet(pump, sim, 1, prefix="old", zone="pve1")
    Proxy.objects.filter(pk=proxy.pk).update(smbios_uuid="", vmgenid="", phase=Phase.PROVISIONING)
    pump.call(reconcile_round)
    pump.run()
    fresh = Proxy.objects.get(pk=proxy.pk)
    assert (fresh.smbios_uuid, fresh.vmgenid) == (proxy.smbios_uuid, proxy.vmgenid)
    assert fresh.phase == Phase.RUNNING


def test_a_recreated_vm_started_before_the_next_round_is_still_found(pump: Pump, sim: Sim) -> None:
    """A converged running proxy is settled from the listing alone (one request per cluster).
    A VM re-created and started behind proxyhub's back looks the same there, except that its
    ``uptime`` says it started after the proxy was last observed: that earns it a read, and
    the read compares the identity."""
    proxy = _restored(pump, sim, "upt")
    # Last observed a minute ago; the impostor starts now.
    Proxy.objects.filter(pk=proxy.pk).update(observed_at=db_now() - timedelta(minutes=1))
    sim.api.start(proxy.node, int(proxy.vmid or 0))
    sim.settle(12.0 * 0.05 + 1.0)  # the listing shows it running (pvestatd's lag, scaled)
    sim.engine.ledger.clear()
    entry = next(e for e in sim.api.cluster_resources() if e.get("vmid") == proxy.vmid)
    assert entry["status"] == "running" and entry["name"] == proxy.vm_name
    pump.call(reconcile_round)
    pump.run()
    _shows_mismatch(proxy)
    assert sim.ledger_mutations() == []


def test_a_vm_restored_and_started_right_after_an_observation_is_caught_at_the_next(
    pump: Pump, sim: Sim
) -> None:
    """The gap issue 14 closes: the listing's ``uptime`` is up to 10 s stale (pvestatd), so a
    start within 10 s of the proxy's last observation used to be taken for the one that
    observation saw, and a VM restored and started then was caught only at the next config
    read (the drift rotation, hours later). The listing is now compared with when the identity
    was last read: a start after that earns one config read, which compares the identity."""
    proxy = _restored(pump, sim, "quick")
    # Observed (and its identity read) just now; the impostor starts a moment later.
    Proxy.objects.filter(pk=proxy.pk).update(observed_at=db_now())
    sim.api.start(proxy.node, int(proxy.vmid or 0))
    sim.settle(12.0 * 0.05 + 1.2)  # the listing shows it running, its uptime at least 1 s
    sim.engine.ledger.clear()
    entry = next(e for e in sim.api.cluster_resources() if e.get("vmid") == proxy.vmid)
    assert entry["status"] == "running" and entry["uptime"] >= 1
    pump.call(reconcile_round)
    pump.run()
    _shows_mismatch(proxy)
    assert sim.ledger_mutations() == []


def test_a_converged_proxy_costs_one_listing_per_round(pump: Pump, sim: Sim) -> None:
    """After its first round. The create read the identity before it started the VM, so the
    first round sees a start since that read and reads the config once (issue 14: the price of
    catching a VM restored right after an observation); from then on, the listing alone."""
    running_fleet(pump, sim, 1, prefix="conv", zone="pve1")
    sim.settle(1.0)
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    pump.run()
    assert [e.key for e in sim.engine.ledger.calls()] == [
        "GET /cluster/resources",
        "GET /nodes/{node}/qemu/{vmid}/config",
    ]
    for _ in range(2):
        sim.engine.ledger.clear()
        pump.call(reconcile_round)
        pump.run()
        assert [e.key for e in sim.engine.ledger.calls()] == ["GET /cluster/resources"]


def _destroyed_behind(sim: Sim, proxy: Proxy) -> None:
    """Someone stops and destroys the proxy's VM in Proxmox, as ``qm`` would."""
    node, vmid = proxy.node, int(proxy.vmid or 0)
    task_ended(sim.api, node, sim.api.stop(node, vmid))
    task_ended(sim.api, node, sim.api.destroy(node, vmid))


@pytest.mark.parametrize("then", ["replace", "delete"])
def test_a_create_that_finds_the_vm_gone_forgets_its_identity_before_it_clones_again(
    pump: Pump, sim: Sim, then: str
) -> None:
    """Found by the long state machine on PostgreSQL: a proxy's VM destroyed outside proxyhub,
    then Provision or retry. The create finds no VM and clones a new one at the same VMID, but
    the proxy still recorded the destroyed VM's SMBIOS UUID and vmgenid (seed 001) until the
    create read its clone's config. A replace or delete the operator asked for in between took
    proxyhub's own clone for a VM restored from a backup and latched the proxy Failed. The
    create's lookup now forgets an identity whose VM it found gone, in its own commit, before
    the clone is sent."""
    (proxy,) = running_fleet(pump, sim, 1, prefix=f"gone{then[:3]}", zone="pve1")
    assert proxy.smbios_uuid and proxy.vmgenid
    _destroyed_behind(sim, proxy)
    asked: list[Operation] = []

    def operator_acts(_: Any) -> None:
        fresh = Proxy.objects.get(pk=proxy.pk)
        service = operations.proxy_replace if then == "replace" else operations.proxy_request_delete
        asked.append(pump.call(service, proxy=fresh))

    # Right after the create's clone was answered, before its step is journalled.
    sim.after("POST /nodes/{node}/qemu/{vmid}/clone", operator_acts)
    pump.call(operations.proxy_retry, proxy=Proxy.objects.get(pk=proxy.pk))
    pump.run()

    (op,) = asked
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    ours = [e["vmid"] for e in sim.api.cluster_resources() if e.get("name") == proxy.vm_name]
    if then == "delete":
        assert not Proxy.objects.filter(pk=proxy.pk).exists()
        assert ours == []
        return
    fresh = Proxy.objects.get(pk=proxy.pk)
    assert fresh.phase == Phase.RUNNING, fresh.last_error
    assert ours == [fresh.vmid]
    found = identity_of(sim.api.vm_config(fresh.node, int(fresh.vmid or 0)))
    assert (fresh.smbios_uuid, fresh.vmgenid) == (found.smbios_uuid, found.vmgenid)
