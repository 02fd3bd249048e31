"""The cluster's "Build a template" action (issue 14): the form, the journal, the catalogue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from pump import Pump, Sim
from test_admin_support import (
    People,
    messages_of,
    people_fixture,  # noqa: F401
)

from provisioning.models import Operation, Template
from provisioning.models.choices import OperationKind, OperationState, RequestedVia
from tests.support.imageserver import ImageServer, image_server

pytestmark = pytest.mark.django_db

CLUSTERS = "/admin/provisioning/cluster/"


@pytest.fixture
def served() -> Iterator[ImageServer]:
    with image_server(b"cloud-image" * 64) as server:
        yield server


def _form(sim: Sim, served: ImageServer, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "action": "build_template",
        "_selected_action": [str(sim.cluster.pk)],
        "post": "yes",
        "key": "debian-13-built",
        "node": "pve1",
        "image_url": served.url(),
        "checksum": served.checksum,
        "vmid": "9100",
        "storage": "local-lvm",
        "template_version": "debian-13-20261016",
        "guest_user": "debian",
        "bridge": "vmbr0",
        "image_storage": "",
        "disk_device": "scsi0",
        "disk_gib": "8",
    }
    data.update(changes)
    return data


def test_an_operator_builds_a_template_through_the_journal(
    pump: Pump, sim: Sim, served: ImageServer, people: People
) -> None:
    client = people.client("operator")
    page = client.post(
        CLUSTERS, {"action": "build_template", "_selected_action": [str(sim.cluster.pk)]}
    )
    assert page.status_code == 200 and b'name="image_url"' in page.content
    assert sim.engine.ledger.calls() == []  # no Proxmox call in the web request

    done = pump.call(client.post, CLUSTERS, _form(sim, served))
    assert done.status_code == 302
    assert messages_of(done) == [
        "Started 1 template build of debian-13-built; the journal shows it."
    ]
    op = Operation.objects.get(kind=OperationKind.TEMPLATE_BUILD)
    assert (op.requested_by_name, op.requested_via) == ("olivia", RequestedVia.ADMIN)
    assert LogEntry.objects.filter(object_repr="pvesim").exists()
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    template = Template.objects.get(key="debian-13-built")
    assert (template.vmid, template.guest_user, template.source_disk_gib) == (9100, "debian", 8)


def test_a_refused_input_is_shown_on_its_field_and_nothing_is_written(
    pump: Pump, sim: Sim, served: ImageServer, people: People
) -> None:
    page = pump.call(
        people.client("operator").post, CLUSTERS, _form(sim, served, checksum="md5:00")
    )
    assert page.status_code == 200
    assert b"a md5 checksum is 32 hexadecimal digits" in page.content
    assert not Operation.objects.exists()


def test_a_build_whose_storage_the_node_lacks_fails_before_downloading(
    pump: Pump, sim: Sim, served: ImageServer, people: People
) -> None:
    pump.call(people.client("operator").post, CLUSTERS, _form(sim, served, storage="nowhere"))
    pump.run()
    op = Operation.objects.get()
    assert op.state == OperationState.FAILED
    assert "storage: no storage 'nowhere' on node pve1" in op.last_error
    assert served.requests == [] and sim.engine.ledger.mutations() == []


def test_a_viewer_may_not_build(sim: Sim, served: ImageServer, people: People) -> None:
    refused = people.client("viewer").post(CLUSTERS, _form(sim, served))
    assert refused.status_code == 403
    assert not Operation.objects.exists()


def test_all_nodes_from_the_console_on_shared_storage_makes_no_copies(
    pump: Pump, sim: Sim, served: ImageServer, people: People
) -> None:
    """The console cannot see that the storage is shared (no Proxmox call in the request), so
    it journals a build per node; the copies' first step finds the storage shared and ends
    without making anything."""
    form = _form(sim, served, storage="vmstore", all_nodes="on")
    pump.call(people.client("operator").post, CLUSTERS, form)
    assert Operation.objects.count() == 3
    pump.run()
    assert set(Operation.objects.values_list("state", flat=True)) == {OperationState.SUCCEEDED}
    template = Template.objects.get(key="debian-13-built")
    assert (template.vmid, template.copies) == (9100, {})
    assert [e["vmid"] for e in sim.api.cluster_resources() if e["vmid"] in (9101, 9102)] == []
    assert len(served.requests) == 1
