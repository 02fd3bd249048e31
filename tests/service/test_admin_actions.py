"""The proxy list's actions, driven through the admin as an operator drives them.

Each destructive or power action first shows a confirmation page with the exact targets, and
only the confirm POST writes operations (with the user, via ``admin``), which the pump then
runs against the in-process simulator. Counts of what Proxmox did come from the simulator's
ledger.
"""

from __future__ import annotations

import pytest
from pump import Pump, Sim, seed_volid_of
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationKind, OperationState, Phase

pytestmark = pytest.mark.django_db

DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
SHUTDOWN = "POST /nodes/{node}/qemu/{vmid}/status/shutdown"
START = "POST /nodes/{node}/qemu/{vmid}/status/start"
CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"


def test_delete_selected_is_not_offered_and_refused_when_posted(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("superuser")
    page = client.get(PROXY_LIST)
    assert b'value="delete_selected"' not in page.content
    assert b'value="delete_vms"' in page.content
    with posting():
        response = client.post(PROXY_LIST, changelist_post("delete_selected", [alpha], post="yes"))
    assert response.status_code == 403
    assert Proxy.objects.filter(pk=alpha.pk).exists()
    assert not Operation.objects.filter(kind=OperationKind.DELETE).exists()
    assert pump.queue == []


def test_delete_confirms_the_exact_targets_then_deletes_vm_disks_and_seed(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha, beta, _gamma = running(pump, sim, "alpha", "beta", "gamma")
    client = people.client("superuser")
    page = client.post(PROXY_LIST, changelist_post("delete_vms", [alpha, beta]))
    assert page.status_code == 200
    text = page.content.decode()
    for proxy in (alpha, beta):
        assert proxy.provider_id in text and f"<td>{proxy.vmid}</td>" in text
        assert seed_volid_of(proxy) in text
    assert "gamma" not in text
    assert not Operation.objects.filter(kind=OperationKind.DELETE).exists(), "confirm first"

    with posting():
        done = client.post(PROXY_LIST, changelist_post("delete_vms", [alpha, beta], post="yes"))
    assert done.status_code == 302
    assert messages_of(done) == [
        "Deleting 2 proxies with their VMs, disks and seed ISOs: alpha, beta."
    ]
    deletes = Operation.objects.filter(kind=OperationKind.DELETE)
    assert sorted(deletes.values_list("proxy_name", "requested_by__username", "requested_via")) == [
        ("alpha", "root", "admin"),
        ("beta", "root", "admin"),
    ]
    pump.run()
    assert list(Proxy.objects.values_list("name", flat=True)) == ["gamma"]
    destroyed = {int(e.path_params["vmid"]) for e in sim.engine.ledger.mutations(key=DESTROY)}
    assert destroyed == {alpha.vmid, beta.vmid}


def test_the_change_page_delete_button_goes_through_the_vm_delete(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("superuser")
    url = f"{PROXY_LIST}{alpha.pk}/delete/"
    change = client.get(f"{PROXY_LIST}{alpha.pk}/change/")
    assert url.encode() in change.content
    page = client.get(url)
    assert page.status_code == 200
    assert alpha.provider_id in page.content.decode()
    assert seed_volid_of(alpha).encode() in page.content
    with posting():
        done = client.post(url, {"post": "yes"})
    assert done.status_code == 302
    alpha.refresh_from_db()  # the row stays until Proxmox confirms the VM is gone
    assert alpha.phase == Phase.DELETING
    pump.run()
    assert not Proxy.objects.exists()
    assert sim.engine.ledger.count("DELETE", DESTROY) == 1


def test_power_confirmation_shows_node_vmid_state_and_each_refusal(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha, beta, gamma = running(pump, sim, "alpha", "beta", "gamma")
    sim.engine.control.set_lock(alpha.vmid, "backup")
    sim.engine.control.set_ha(beta.vmid)
    client = people.client("operator")
    page = client.post(PROXY_LIST, changelist_post("shutdown", [alpha, beta, gamma]))
    assert page.status_code == 200
    rows = _rows(page.content.decode())
    assert rows["alpha"][:4] == ["alpha", "pve1", str(alpha.vmid), "running, lock: backup"]
    assert "is locked (backup)" in rows["alpha"][-1]
    assert "managed by Proxmox HA" in rows["beta"][-1]
    assert rows["gamma"][:4] == ["gamma", "pve1", str(gamma.vmid), "running"]
    assert rows["gamma"][4] == "will be sent"
    assert b"Yes, shut down (1)" in page.content
    assert not sim.engine.ledger.mutations(key=SHUTDOWN), "nothing is sent before the confirm"

    with posting():
        done = client.post(
            PROXY_LIST, changelist_post("shutdown", [alpha, beta, gamma], post="yes")
        )
    assert done.status_code == 302
    assert messages_of(done)[0] == "Shutting down 1 proxy: gamma."
    assert messages_of(done)[1].startswith("2 proxies were skipped: alpha: refused: VM")
    op = Operation.objects.get(kind=OperationKind.SHUTDOWN)
    assert (op.proxy_name, op.requested_by.username, op.requested_via) == (
        "gamma",
        "olivia",
        "admin",
    )
    pump.run()
    gamma.refresh_from_db()
    assert gamma.phase == Phase.STOPPED
    shut = [int(e.path_params["vmid"]) for e in sim.engine.ledger.mutations(key=SHUTDOWN)]
    assert shut == [gamma.vmid]


def test_shutdown_and_start_again_through_the_confirmation(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    # A started VM reads Provisioning until its guest agent reports the address again.
    for action, status, phases in (
        ("shutdown", "stopped", {Phase.STOPPED}),
        ("start", "running", {Phase.PROVISIONING, Phase.RUNNING}),
    ):
        page = client.post(PROXY_LIST, changelist_post(action, [alpha]))
        assert page.status_code == 200 and b"will be sent" in page.content
        with posting():
            client.post(PROXY_LIST, changelist_post(action, [alpha], post="yes"))
        pump.run()
        alpha.refresh_from_db()
        assert alpha.phase in phases, action
        assert sim.engine.control.vm(alpha.vmid)["status"] == status
    assert sim.engine.ledger.count("POST", SHUTDOWN) == 1
    assert sim.engine.ledger.count("POST", START) == 2  # the create's, then ours
    ops = Operation.objects.filter(proxy=alpha).order_by("created_at")
    assert [(o.kind, o.state) for o in ops] == [
        ("create", OperationState.SUCCEEDED),
        ("shutdown", OperationState.SUCCEEDED),
        ("start", OperationState.SUCCEEDED),
    ]


def test_starting_a_running_vm_is_shown_as_a_no_op(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    page = people.client("operator").post(PROXY_LIST, changelist_post("start", [alpha]))
    assert "is already running; start skipped" in page.content.decode()


def test_provision_retries_a_failed_proxy_and_clears_it(
    pump: Pump, sim: Sim, people: People
) -> None:
    sim.engine.control.deny("/vms", "VM.PowerMgmt")
    from test_admin_support import spec

    from provisioning.services import operations

    pump.call(operations.proxy_create, spec=spec(sim, "alpha"))
    pump.run()
    alpha = Proxy.objects.get()
    assert alpha.phase == Phase.FAILED
    sim.engine.control.allow()
    client = people.client("operator")
    with posting():
        done = client.post(PROXY_LIST, changelist_post("provision", [alpha]))
    assert messages_of(done) == ["Queued provisioning of 1 proxy: alpha."]
    alpha.refresh_from_db()
    assert alpha.phase == Phase.PENDING and alpha.last_error == ""
    retry = Operation.objects.filter(proxy=alpha).latest("created_at")
    assert (retry.kind, retry.requested_by.username, retry.requested_via) == (
        "create",
        "olivia",
        "admin",
    )
    pump.run()
    alpha.refresh_from_db()
    assert alpha.phase == Phase.RUNNING
    # Asking again while nothing failed queues a new create that adopts the VM; asking while
    # one runs reports it instead of queueing a second.
    with posting():
        client.post(PROXY_LIST, changelist_post("provision", [alpha]))
        again = client.post(PROXY_LIST, changelist_post("provision", [alpha]))
    assert messages_of(again)[-1] == "1 proxy already has an operation running: alpha."


def test_replace_confirms_then_builds_a_new_vm(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    old_vmid = alpha.vmid
    client = people.client("operator")
    page = client.post(PROXY_LIST, changelist_post("replace", [alpha]))
    assert page.status_code == 200 and str(old_vmid) in page.content.decode()
    assert not Operation.objects.filter(kind=OperationKind.REPLACE).exists()
    with posting():
        done = client.post(PROXY_LIST, changelist_post("replace", [alpha], post="yes"))
    assert messages_of(done) == ["Replacing the VM of 1 proxy: alpha."]
    pump.run()
    alpha.refresh_from_db()
    assert alpha.phase == Phase.RUNNING
    assert sim.engine.ledger.count("DELETE", DESTROY) == 1
    assert len(sim.engine.ledger.mutations(key=CLONE)) == 2


def test_preview_plan_shows_the_plan_and_asks_proxmox_nothing(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    calls = sim.engine.ledger.count()
    page = people.client("operator").post(PROXY_LIST, changelist_post("preview_plan", [alpha]))
    assert page.status_code == 200
    text = page.content.decode()
    assert sim.engine.ledger.count() == calls
    from provisioning.services.plans import plan_preview

    plan = plan_preview(alpha)
    assert plan.plan_hash in text and plan.seed_volid in text
    assert "debian-13 → VM 9000" in text
    assert f"{plan.vmid_candidate}" in text
    for step in ("lookup", "clone", "upload", "configure", "resize", "start", "address"):
        assert f"<strong>{step}</strong>" in text
    assert not Operation.objects.exclude(kind=OperationKind.CREATE).exists()


def test_preflight_reports_each_check_with_get_requests_only(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    sim.engine.ledger.clear()
    page = people.client("operator").post(PROXY_LIST, changelist_post("preflight", [alpha]))
    assert page.status_code == 200
    text = page.content.decode()
    for code in ("template_exists", "iso_storage", "bridge", "vmid_candidate", "node_online"):
        assert code in text
    assert "passed" in text
    methods = {e.method for e in sim.engine.ledger.calls()}
    assert methods == {"GET"}
    assert Operation.objects.count() == 1  # the create only


def _rows(html: str) -> dict[str, list[str]]:
    """The confirmation table's rows by proxy name, cells as text."""
    import re

    from django.utils.html import strip_tags

    body = html.split('id="targets"', 1)[1].split("</table>", 1)[0]
    rows: dict[str, list[str]] = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)[1:]:
        cells = [strip_tags(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        rows[cells[0]] = cells
    return rows


def test_accept_vm_confirms_then_adopts_only_the_proxy_with_an_identity_mismatch(
    pump: Pump, sim: Sim, people: People
) -> None:
    """Seed 001: a VM re-created at the proxy's VMID is shown as a mismatch (class and what to
    do on the change page); only the confirmed "Accept the VM found" makes it the proxy's."""
    from provisioning.services.reconcile import reconcile_round

    alpha, beta = running(pump, sim, "alpha", "beta")
    sim.engine.control.recreate_vm(int(alpha.vmid or 0))
    sim.settle(1.0)
    pump.call(reconcile_round)
    pump.run()
    client = people.client("operator")
    change = client.get(f"{PROXY_LIST}{alpha.pk}/change/").content.decode()
    assert "Identity mismatch" in change and "Accept the VM found" in change
    assert alpha.smbios_uuid in change

    page = client.post(PROXY_LIST, changelist_post("accept_vm", [alpha, beta]))
    assert page.status_code == 200
    assert "shows no identity mismatch" in page.content.decode()  # beta is struck through
    assert Proxy.objects.get(pk=alpha.pk).phase == Phase.FAILED, "confirm first"

    with posting():
        done = client.post(PROXY_LIST, changelist_post("accept_vm", [alpha, beta], post="yes"))
    assert messages_of(done)[0] == "Accepted the VM found for 1 proxy: alpha."
    pump.run()
    fresh = Proxy.objects.get(pk=alpha.pk)
    assert (fresh.phase, fresh.vmid) == (Phase.RUNNING, alpha.vmid)
    assert fresh.smbios_uuid != alpha.smbios_uuid
    assert Proxy.objects.get(pk=beta.pk).smbios_uuid == beta.smbios_uuid
    # Adopted, not replaced: the only clones are alpha's and beta's first creates.
    assert len(sim.engine.ledger.mutations(key=CLONE)) == 2


def test_the_power_confirmation_refuses_a_recreated_vm(
    pump: Pump, sim: Sim, people: People
) -> None:
    """Seed 001: the page's read already compares the recorded identity; nothing is sent."""
    (alpha,) = running(pump, sim, "alpha")
    sim.engine.control.recreate_vm(int(alpha.vmid or 0))
    sim.settle(1.0)
    sim.engine.ledger.clear()
    page = people.client("operator").post(PROXY_LIST, changelist_post("start", [alpha]))
    assert page.status_code == 200
    assert "not the VM proxyhub made" in page.content.decode()
    assert sim.engine.ledger.mutations() == []
