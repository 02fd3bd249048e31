"""``proxies accept-vm`` (seed 001, issue 14): the command door onto the service the admin's
"Accept the VM found…" uses. It accepts the VM found at a proxy whose identity does not match,
refuses (doing nothing) when any named proxy shows no mismatch, and ``proxies list --json``
shows the mismatch before and the new identity after. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from pump import Pump, Sim, running_fleet

from provisioning.models import Operation, Proxy
from provisioning.models.choices import ErrorClass, OperationKind, Phase, RequestedVia
from provisioning.proxmox.identity import identity_of
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _listed(name: str) -> dict[str, object]:
    rows = json.loads(_run("proxies", "list", "--json"))
    return next(r for r in rows if r["name"] == name)


def _mismatched(pump: Pump, sim: Sim, prefix: str) -> Proxy:
    (proxy,) = running_fleet(pump, sim, 1, prefix=prefix, zone="pve1")
    sim.engine.control.recreate_vm(int(proxy.vmid or 0))
    sim.settle(1.0)
    pump.call(reconcile_round)
    pump.run()
    fresh = Proxy.objects.get(pk=proxy.pk)
    assert (fresh.phase, fresh.last_error_class) == (Phase.FAILED, ErrorClass.IDENTITY)
    return fresh


def test_accept_vm_adopts_the_found_vm_and_list_shows_it(pump: Pump, sim: Sim) -> None:
    proxy = _mismatched(pump, sim, "cmdacc")
    before = _listed(proxy.name)["identity"]
    assert before == {
        "smbiosUuid": proxy.smbios_uuid,
        "vmgenid": proxy.vmgenid,
        "checkedAt": before["checkedAt"],  # type: ignore[index]
        "mismatch": True,
    }
    out = pump.call(_run, "proxies", "accept-vm", proxy.name, "--json")
    [row] = json.loads(out)
    op = Operation.objects.get(pk=row["operation"])
    assert row["name"] == proxy.name
    assert (op.kind, op.requested_via) == (OperationKind.CREATE, RequestedVia.COMMAND)
    pump.run()
    fresh = Proxy.objects.get(pk=proxy.pk)
    found = identity_of(sim.api.vm_config(proxy.node, int(proxy.vmid or 0)))
    assert fresh.phase == Phase.RUNNING and fresh.vmid == proxy.vmid
    after = _listed(proxy.name)["identity"]
    assert after["smbiosUuid"] == found.smbios_uuid != proxy.smbios_uuid  # type: ignore[index]
    assert after["mismatch"] is False  # type: ignore[index]


def test_accept_vm_refuses_a_proxy_without_a_mismatch_and_does_nothing(
    pump: Pump, sim: Sim
) -> None:
    wrong = _mismatched(pump, sim, "cmdmix")
    (fine,) = running_fleet(pump, sim, 1, prefix="cmdok", zone="pve1")
    operations_before = Operation.objects.count()
    with pytest.raises(CommandError) as caught:
        pump.call(_run, "proxies", "accept-vm", wrong.name, fine.name)
    message = str(caught.value)
    assert "nothing was done" in message
    assert f"{fine.name}: shows no identity mismatch" in message and wrong.name not in message
    # The mismatched proxy was not accepted either: all or nothing.
    assert Proxy.objects.get(pk=wrong.pk).smbios_uuid == wrong.smbios_uuid
    assert Proxy.objects.get(pk=wrong.pk).phase == Phase.FAILED
    assert Operation.objects.count() == operations_before
    assert pump.queue == []


def test_accept_vm_refuses_unknown_names(sim: Sim) -> None:
    with pytest.raises(CommandError, match="no proxy is named ghost"):
        _run("proxies", "accept-vm", "ghost")
