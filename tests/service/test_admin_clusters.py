"""The cluster page: the catalogue edited inline with the import's rules, health per node, and
the "check now" and "preflight" actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from pump import ABSENT_TOKEN, Pump, Sim
from test_admin_support import (
    People,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning.models import Cluster

pytestmark = pytest.mark.django_db

CLUSTERS = "/admin/provisioning/cluster/"


def _inline(prefix: str, rows: list[dict[str, Any]], initial: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for i, row in enumerate(rows):
        for key, value in row.items():
            data[f"{prefix}-{i}-{key}"] = value
    return data


def _cluster_form(
    *,
    nodes: list[str] = ("pve1",),  # type: ignore[assignment]
    templates: list[tuple[str, int]] = (("debian-13", 9000),),  # type: ignore[assignment]
    machine_types: list[tuple[str, int, int]] = (("small", 1, 1024),),  # type: ignore[assignment]
    **fields: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "proxmox-home",
        "url": "https://192.168.0.8:8006",
        # Inside the test settings' credentials directory (issue 11); it need not exist.
        "token_file": ABSENT_TOKEN,
        "ca_file": "",
        "iso_storage": "proxy-seeds",
        "storage": "",
        "bridge": "",
        "vlan_tag": "",
        "vmid_min": "100000",
        "vmid_max": "199999",
        "request_timeout_seconds": "30",
        "vendor_data": "",
        "install_guest_agent": "on",
        "drift_policy": "report",
    }
    data.update(fields)
    data.update(_inline("nodes", [{"name": n, "position": i} for i, n in enumerate(nodes)]))
    data.update(_inline("templates", [{"key": k, "vmid": v} for k, v in templates]))
    data.update(
        _inline(
            "machine_types",
            [{"key": k, "cores": c, "memory_mib": m, "disk_gib": ""} for k, c, m in machine_types],
        )
    )
    return data


def test_a_cluster_is_added_with_its_catalogue_inline(people: People) -> None:
    client = people.client("superuser")
    assert client.get(f"{CLUSTERS}add/").status_code == 200
    done = client.post(
        f"{CLUSTERS}add/",
        _cluster_form(nodes=["pve1", "pve2"], templates=[("debian-13", 9000), ("alpine", 9100)]),
    )
    assert done.status_code == 302, done.content.decode()[:2000]
    cluster = Cluster.objects.get(name="proxmox-home")
    config = cluster.proxmox_config("ph-test")
    assert config.nodes == ("pve1", "pve2")
    assert set(config.templates) == {"debian-13", "alpine"}
    assert set(config.machine_types) == {"small"}


@pytest.mark.parametrize(
    ("form", "error"),
    [
        (_cluster_form(nodes=[]), "a cluster needs at least one node"),
        (_cluster_form(templates=[]), "a cluster needs at least one template"),
        (_cluster_form(machine_types=[]), "a cluster needs at least one machine type"),
        (
            _cluster_form(templates=[("debian-13", 9000), ("debian-13", 9001)]),
            "template given twice: debian-13",
        ),
        (
            _cluster_form(machine_types=[(f"m{i}", 1, 1024) for i in range(129)]),
            "a cluster holds at most 128 machine types, got 129",
        ),
        (_cluster_form(url="http://pve:8006"), "must be an https URL"),
        (_cluster_form(vmid_min="5000", vmid_max="4000"), "min must be below max"),
        (_cluster_form(iso_storage="bad storage!"), "must be a Proxmox storage id"),
    ],
)
def test_the_catalogue_rules_are_the_imports(
    people: People, form: dict[str, Any], error: str
) -> None:
    page = people.client("superuser").post(f"{CLUSTERS}add/", form)
    assert page.status_code == 200
    assert error in page.content.decode()
    assert not Cluster.objects.filter(name="proxmox-home").exists()


def test_128_machine_types_are_accepted(people: People) -> None:
    form = _cluster_form(machine_types=[(f"m{i}", 1, 1024) for i in range(128)])
    assert people.client("superuser").post(f"{CLUSTERS}add/", form).status_code == 302
    assert Cluster.objects.get(name="proxmox-home").machine_types.count() == 128


def _as_saved(cluster: Cluster, **template_changes: dict[str, Any]) -> dict[str, Any]:
    """The change form of ``cluster`` as the page posts it, with per-template changes."""
    data = _cluster_form(
        name=cluster.name,
        url=cluster.url,
        token_file=cluster.token_file,
        iso_storage=cluster.iso_storage,
    )
    nodes = list(cluster.nodes.order_by("position"))
    templates = list(cluster.templates.order_by("key"))
    machines = list(cluster.machine_types.order_by("key"))
    data.update(
        _inline(
            "nodes",
            [{"id": n.pk, "name": n.name, "position": n.position} for n in nodes],
            initial=len(nodes),
        )
    )
    data.update(
        _inline(
            "templates",
            [
                {"id": t.pk, "key": t.key, "vmid": t.vmid, **template_changes.get(t.key, {})}
                for t in templates
            ],
            initial=len(templates),
        )
    )
    data.update(
        _inline(
            "machine_types",
            [
                {
                    "id": m.pk,
                    "key": m.key,
                    "cores": m.cores,
                    "memory_mib": m.memory_mib,
                    "disk_gib": m.disk_gib or "",
                }
                for m in machines
            ],
            initial=len(machines),
        )
    )
    return data


def test_a_template_a_live_proxy_uses_cannot_be_removed_or_renamed(
    pump: Pump, sim: Sim, people: People
) -> None:
    running(pump, sim, "alpha")
    cluster = sim.cluster
    client = people.client("superuser")
    url = f"{CLUSTERS}{cluster.pk}/change/"
    assert client.get(url).status_code == 200
    for change in ({"DELETE": "on"}, {"key": "debian-14"}):
        refused = client.post(url, _as_saved(cluster, **{"debian-13": change}))
        assert refused.status_code == 200
        text = refused.content.decode().replace("&quot;", '"')
        assert 'template "debian-13" is still used by alpha' in text
        assert cluster.templates.filter(key="debian-13").exists()


def test_editing_a_child_row_moves_the_clusters_updated_at(sim: Sim, people: People) -> None:
    """The provider cache is keyed on updated_at: an edited catalogue must take effect."""
    cluster = sim.cluster
    before = Cluster.objects.get(pk=cluster.pk).updated_at
    done = people.client("superuser").post(
        f"{CLUSTERS}{cluster.pk}/change/", _as_saved(cluster, **{"debian-13": {"vmid": "9050"}})
    )
    assert done.status_code == 302, done.content.decode()[:3000]
    after = Cluster.objects.get(pk=cluster.pk)
    assert after.templates.get(key="debian-13").vmid == 9050
    assert after.updated_at > before


def test_the_drift_policy_is_edited_on_the_cluster_page(sim: Sim, people: People) -> None:
    """Issue 14: ``report`` or ``repair``; anything else is refused on the field."""
    cluster, client = sim.cluster, people.client("superuser")
    refused = client.post(
        f"{CLUSTERS}{cluster.pk}/change/", _as_saved(cluster) | {"drift_policy": "fix"}
    )
    assert refused.status_code == 200 and "fix is not one of the available choices" in (
        refused.content.decode()
    )
    done = client.post(
        f"{CLUSTERS}{cluster.pk}/change/", _as_saved(cluster) | {"drift_policy": "repair"}
    )
    assert done.status_code == 302, done.content.decode()[:3000]
    assert Cluster.objects.get(pk=cluster.pk).drift_policy == "repair"


def test_check_now_sends_one_health_round_and_records_who_asked(
    sim: Sim, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import current_app

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **kw: sent.append((name, kw)))
    client = people.client("operator")
    with posting():
        done = client.post(
            CLUSTERS, {"action": "check_now", "_selected_action": [str(sim.cluster.pk)]}
        )
    assert done.status_code == 302
    assert sent == [("proxyhub.health.check_round", {"queue": "health"})]
    assert messages_of(done)[0].startswith("Requested a node health check covering 1 cluster")
    entry = LogEntry.objects.get()
    assert (entry.user.username, entry.object_repr) == ("olivia", "pvesim")


def test_cluster_preflight_checks_every_template_on_every_node_with_gets_only(
    sim: Sim, people: People
) -> None:
    sim.engine.ledger.clear()
    page = people.client("operator").post(
        CLUSTERS, {"action": "preflight", "_selected_action": [str(sim.cluster.pk)]}
    )
    assert page.status_code == 200
    text = page.content.decode()
    for image in ("debian-13", "debian-13-noagent", "debian-13-cloudinit"):
        for node in ("pve1", "pve2", "pve3"):
            assert f"pvesim: {image} on {node} (small)" in text
    assert "template_no_cloudinit_drive" in text and "failed" in text  # the cloud-init template
    assert {e.method for e in sim.engine.ledger.calls()} == {"GET"}


VENDOR_CANARY = "vendor-admin-canary-91ab3f"


def test_vendor_data_is_sealed_never_shown_kept_when_blank_and_cleared_on_request(
    sim: Sim, people: People
) -> None:
    cluster = sim.cluster
    client = people.client("superuser")
    url = f"{CLUSTERS}{cluster.pk}/change/"
    vendor = f"#cloud-config\r\nwrite_files:\r\n  - content: {VENDOR_CANARY}\r\n"

    done = client.post(url, {**_as_saved(cluster), "vendor_data": vendor})
    assert done.status_code == 302, done.content.decode()[:3000]
    stored = Cluster.objects.get(pk=cluster.pk)
    assert stored.vendor_data == vendor.replace("\r\n", "\n")
    assert VENDOR_CANARY.encode() not in bytes(stored.vendor_data_sealed)
    page = client.get(url).content.decode()
    assert VENDOR_CANARY not in page and "vendor-data is stored, sealed" in page

    # A form error shows the page again without the pasted vendor-data.
    refused = client.post(
        url, {**_as_saved(cluster), "vendor_data": vendor, "clear_vendor_data": "on"}
    )
    assert refused.status_code == 200 and VENDOR_CANARY not in refused.content.decode()
    assert "give new vendor-data or tick clear, not both" in refused.content.decode()

    kept = client.post(url, {**_as_saved(cluster), "vendor_data": ""})
    assert kept.status_code == 302
    assert Cluster.objects.get(pk=cluster.pk).vendor_data == vendor.replace("\r\n", "\n")

    cleared = client.post(url, {**_as_saved(cluster), "clear_vendor_data": "on"})
    assert cleared.status_code == 302
    assert bytes(Cluster.objects.get(pk=cluster.pk).vendor_data_sealed) == b""
