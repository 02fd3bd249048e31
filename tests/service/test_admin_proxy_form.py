"""The proxy add and change forms: every save goes through the services, a changed placement or
cloud-init replaces the VM, and problems are field errors an operator can act on."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from pump import Pump, Sim, seed_volid_of
from test_admin_support import (
    CLOUD_INIT,
    CLOUD_INIT_CANARY,
    PROXY_LIST,
    People,
    changelist_post,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning import sealing
from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationKind, Phase

pytestmark = pytest.mark.django_db

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"


def _add(sim: Sim, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "alpha",
        "cluster": sim.cluster.pk,
        "zone": "pve2",
        "machine_type": "small",
        "image": "debian-13",
        "cloud_init_text": CLOUD_INIT,
    }
    data.update(overrides)
    return data


def _change(proxy: Proxy, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "zone": proxy.zone,
        "machine_type": proxy.machine_type,
        "image": proxy.image,
    }
    data.update(overrides)
    return data


def test_adding_a_proxy_creates_it_through_the_service(
    pump: Pump, sim: Sim, people: People
) -> None:
    client = people.client("operator")
    form = client.get(f"{PROXY_LIST}add/").content.decode()
    assert '<datalist id="ph-machine-types"><option value="small">' in form
    with posting():
        done = client.post(f"{PROXY_LIST}add/", _add(sim))
    assert done.status_code == 302
    proxy = Proxy.objects.get()
    assert proxy.cloud_init == CLOUD_INIT.encode()
    op = Operation.objects.get()
    assert (op.kind, op.requested_by.username, op.requested_via) == ("create", "olivia", "admin")
    pump.run()
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING and proxy.node == "pve2"


@pytest.mark.parametrize(
    ("overrides", "field", "error"),
    [
        ({"machine_type": "huge"}, "machine_type", 'placement.machineType "huge"'),
        ({"zone": "pve7"}, "zone", 'placement.zone "pve7" is not in proxmox.nodes'),
        ({"name": "Alpha_1"}, "name", "a DNS label"),
        (
            {"cloud_init_file": SimpleUploadedFile("u", b"#cloud-config\n")},
            "cloud_init_text",
            "as a file or as pasted text, not both",
        ),
    ],
)
def test_a_bad_add_form_names_the_field_and_writes_nothing(
    sim: Sim, people: People, overrides: dict[str, Any], field: str, error: str
) -> None:
    page = people.client("operator").post(f"{PROXY_LIST}add/", _add(sim, **overrides))
    assert page.status_code == 200
    text = page.content.decode().replace("&quot;", '"')
    assert error in text
    assert f"field-{field}" in text.split(error)[0].rsplit("form-row", 1)[-1]
    assert CLOUD_INIT_CANARY not in text  # the paste is not echoed back
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_changing_the_placement_replaces_the_vm(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    with posting():
        done = client.post(f"{PROXY_LIST}{alpha.pk}/change/", _change(alpha, zone="pve3"))
    assert done.status_code == 302
    assert "its VM is being replaced" in " ".join(messages_of(done))
    replace = Operation.objects.get(kind=OperationKind.REPLACE)
    assert (replace.requested_by.username, replace.requested_via) == ("olivia", "admin")
    pump.run()
    alpha.refresh_from_db()
    assert alpha.phase == Phase.RUNNING and alpha.node == "pve3"
    assert sim.engine.ledger.count("DELETE", DESTROY) == 1


def test_uploading_new_cloud_init_replaces_the_vm_with_it(
    pump: Pump, sim: Sim, people: People, settings: Any
) -> None:
    settings.PROXYHUB_KEEP_SEED_ISO = True  # the new seed is read back below
    (alpha,) = running(pump, sim, "alpha")
    new = b"#cloud-config\nhostname: renewed\n"
    with posting():
        people.client("operator").post(
            f"{PROXY_LIST}{alpha.pk}/change/",
            _change(alpha, cloud_init_file=SimpleUploadedFile("user-data", new)),
        )
    pump.run()
    alpha.refresh_from_db()
    assert alpha.cloud_init == new and alpha.cloud_init_sha256 == sealing.digest(new)
    seed = sim.engine.control.volume_data(alpha.node, seed_volid_of(alpha))
    assert seed is not None and b"hostname: renewed" in seed
    assert len(sim.engine.ledger.mutations(key=CLONE)) == 2


def test_saving_an_unchanged_proxy_queues_nothing(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    with posting():
        done = people.client("operator").post(f"{PROXY_LIST}{alpha.pk}/change/", _change(alpha))
    assert done.status_code == 302
    assert Operation.objects.count() == 1 and pump.queue == []


def test_a_proxy_being_deleted_cannot_be_changed_or_provisioned_twice(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("superuser")
    with posting():
        client.post(PROXY_LIST, changelist_post("delete_vms", [alpha], post="yes"))
    refused = client.post(f"{PROXY_LIST}{alpha.pk}/change/", _change(alpha, zone="pve3"))
    assert "the proxy is being deleted" in refused.content.decode()
    with posting():
        again = client.post(PROXY_LIST, changelist_post("provision", [alpha]))
    assert messages_of(again)[-1] == "1 proxy already has an operation running: alpha."
    assert Operation.objects.filter(kind=OperationKind.DELETE).count() == 1


def test_an_action_over_too_many_proxies_is_refused_whole(sim: Sim, people: People) -> None:
    Proxy.objects.bulk_create(
        Proxy(name=f"p-{i:03d}", cluster=sim.cluster, machine_type="small", image="debian-13")
        for i in range(501)
    )
    first = Proxy.objects.order_by("name").first()
    assert first is not None
    with posting():
        refused = people.client("superuser").post(
            PROXY_LIST,
            changelist_post("delete_vms", [first], select_across="1", post="yes"),
        )
    assert "501 proxies are selected; an action covers at most 500" in messages_of(refused)[0]
    assert not Operation.objects.exists()
