"""The inventory snapshot (issue 14): refresh, cap, failure, the command and the admin page,
against the in-process simulator; counts from its ledger. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask
from pump import Pump, Sim, make_cluster, running_fleet

from provisioning import tasks
from provisioning.models import Cluster, InventoryGuest, InventoryRefresh
from provisioning.services.inventory import inventory_refresh, inventory_refresh_all

pytestmark = pytest.mark.django_db

LISTING = "GET /cluster/resources"
CONFIG = "GET /nodes/{node}/qemu/{vmid}/config"
JSON_KEYS = {
    "cluster",
    "node",
    "vmid",
    "name",
    "type",
    "status",
    "lock",
    "template",
    "pool",
    "owner",
}


def _owners(cluster: Cluster) -> dict[int, str]:
    return dict(InventoryGuest.objects.filter(cluster=cluster).values_list("vmid", "owner"))


def test_refresh_takes_every_guest_and_replaces_the_snapshot(pump: Pump, sim: Sim) -> None:
    (proxy,) = running_fleet(pump, sim, 1)
    sim.engine.control.set_pool(100, "prod")
    # Uptime counts whole seconds: a VM that has run under a second when its mark is read is
    # read again next time (it cannot yet be shown to have run since that snapshot).
    sim.settle(1.0)
    sim.engine.ledger.clear()
    outcome = inventory_refresh(cluster=sim.cluster)
    assert outcome.error == "" and not outcome.truncated
    owners = _owners(sim.cluster)
    assert owners == {
        100: "foreign",
        101: "foreign",
        102: "other",
        200: "foreign",
        9000: "foreign",
        9001: "foreign",
        9002: "foreign",
        proxy.vmid: "this",
    }
    web = InventoryGuest.objects.get(cluster=sim.cluster, vmid=100)
    assert (web.pool, web.tags, web.type, web.status) == ("prod", "web", "qemu", "running")
    assert InventoryGuest.objects.get(vmid=200).type == "lxc"
    assert sim.engine.ledger.count("GET", LISTING) == 1
    first = InventoryRefresh.objects.get(cluster=sim.cluster)
    assert first.count == 8 and first.listed == 8 and first.error == ""

    # The world changes: a guest goes, another comes. The next refresh shows exactly the new
    # listing, and marks read before are not read again.
    sim.api.destroy("pve2", 101)
    sim.settle()
    sim.engine.control.create_vms(1, start_vmid=4000, tags=None, name_prefix="batch-")
    sim.engine.ledger.clear()
    inventory_refresh(cluster=sim.cluster)
    owners = _owners(sim.cluster)
    assert 101 not in owners and owners[4000] == "foreign" and owners[proxy.vmid] == "this"
    assert sim.engine.ledger.count("GET", LISTING) == 1
    assert sim.engine.ledger.count("GET", CONFIG) == 0
    assert sim.engine.ledger.mutations() == []
    second = InventoryRefresh.objects.get(cluster=sim.cluster)
    assert second.refreshed_at is not None and first.refreshed_at is not None
    assert second.refreshed_at > first.refreshed_at and second.count == 8


def test_an_older_refresh_finishing_last_does_not_overwrite_a_newer_snapshot(sim: Sim) -> None:
    """Two refreshes of one cluster overlap (Beat's and an operator's ``--refresh``): the one
    whose listing is older must not replace the snapshot the newer one wrote."""

    def newer_refresh(_: Any) -> None:
        # The first refresh has its listing; the cluster changes and a second refresh runs.
        sim.engine.control.create_vms(1, start_vmid=4000, tags=None, name_prefix="late-")
        inventory_refresh(cluster=sim.cluster)

    sim.after(LISTING, newer_refresh)
    inventory_refresh(cluster=sim.cluster)
    assert 4000 in _owners(sim.cluster)
    assert InventoryRefresh.objects.get(cluster=sim.cluster).count == 8


def test_an_oversized_value_is_cut_to_its_column_not_refused(sim: Sim) -> None:
    tags = ";".join(f"tag-{i:04d}" for i in range(150))  # 1,349 characters
    sim.api.set_vm_config("pve1", 100, {"tags": tags})
    assert inventory_refresh(cluster=sim.cluster).error == ""
    stored = InventoryGuest.objects.get(cluster=sim.cluster, vmid=100).tags
    assert len(stored) == 1024 and tags.startswith(stored)


def test_one_listing_per_cluster(sim: Sim) -> None:
    other = make_cluster("second")  # the same simulator answers for both (pump's factory)
    sim.engine.ledger.clear()
    outcomes = inventory_refresh_all()
    assert [o.cluster for o in outcomes] == ["pvesim", "second"]
    assert sim.engine.ledger.count("GET", LISTING) == 2
    assert InventoryGuest.objects.filter(cluster=other).count() == 7
    assert InventoryGuest.objects.filter(cluster=sim.cluster).count() == 7


def test_the_snapshot_is_capped_at_4096_rows_and_says_it_was_truncated(sim: Sim) -> None:
    sim.engine.control.create_vms(4100, start_vmid=10000, tags=None, name_prefix="bulk-")
    outcome = inventory_refresh(cluster=sim.cluster)
    assert outcome.truncated and outcome.count == 4096 and outcome.listed == 4107
    assert InventoryGuest.objects.filter(cluster=sim.cluster).count() == 4096
    record = InventoryRefresh.objects.get(cluster=sim.cluster)
    assert record.truncated and record.count == 4096 and record.listed == 4107
    # The lowest VMIDs are kept: the seven default guests and the first 4,089 bulk ones.
    kept = set(InventoryGuest.objects.filter(cluster=sim.cluster).values_list("vmid", flat=True))
    assert {100, 9002, 10000, 14088} <= kept and 14089 not in kept
    out = StringIO()
    call_command("inventory", "--cluster", "pvesim", stdout=out)
    assert "truncated: 4107 listed, only 4096 kept" in out.getvalue()


def test_a_failing_cluster_keeps_its_previous_snapshot_and_records_why(sim: Sim) -> None:
    inventory_refresh(cluster=sim.cluster)
    before = InventoryRefresh.objects.get(cluster=sim.cluster)
    sim.engine.control.fail_call("GET", "/cluster/resources", kind="595", times=20)
    outcome = inventory_refresh(cluster=sim.cluster)
    assert outcome.error
    after = InventoryRefresh.objects.get(cluster=sim.cluster)
    assert after.refreshed_at == before.refreshed_at and after.count == before.count
    assert after.error == outcome.error and after.attempted_at != before.attempted_at
    assert len(_owners(sim.cluster)) == 7
    # The command shows the old snapshot and exits non-zero; the task counts the failure.
    out = StringIO()
    with pytest.raises(CommandError, match="inventory refresh failed"):
        call_command("inventory", "--refresh", "--json", stdout=out)
    assert len(json.loads(out.getvalue())) == 7
    assert tasks.inventory_refresh() == 1
    sim.engine.control.clear_faults()
    assert tasks.inventory_refresh() == 0
    assert InventoryRefresh.objects.get(cluster=sim.cluster).error == ""


def test_command_json_shape(sim: Sim) -> None:
    sim.engine.control.set_lock(101, "backup")
    out = StringIO()
    call_command("inventory", "--refresh", "--json", "--cluster", "pvesim", stdout=out)
    rows = json.loads(out.getvalue())
    assert isinstance(rows, list) and len(rows) == 7
    for row in rows:
        assert set(row) >= JSON_KEYS
        assert row["owner"] in ("this", "other", "foreign")
        assert row["type"] in ("qemu", "lxc")
        assert isinstance(row["vmid"], int) and isinstance(row["template"], bool)
    by_vmid = {r["vmid"]: r for r in rows}
    assert by_vmid[101]["lock"] == "backup" and by_vmid[100]["lock"] is None
    assert by_vmid[9000]["template"] is True and by_vmid[102]["owner"] == "other"
    assert by_vmid[200] | {"cluster": "pvesim", "node": "pve2", "type": "lxc"} == by_vmid[200]


def test_command_refuses_an_unknown_cluster(sim: Sim) -> None:
    with pytest.raises(CommandError, match="--cluster 'nope' is not a configured cluster"):
        call_command("inventory", "--cluster", "nope", "--json")
    assert not InventoryRefresh.objects.exists()


def test_beat_refreshes_on_the_control_queue() -> None:
    from django.conf import settings

    schedule = PeriodicTask.objects.get(name="proxyhub: inventory refresh")
    assert schedule.task == tasks.inventory_refresh.name
    assert schedule.task == "proxyhub.provisioning.inventory_refresh"
    assert schedule.queue == "control" and schedule.enabled
    assert settings.CELERY_TASK_ROUTES[schedule.task] == {"queue": "control"}


# --- the admin page -----------------------------------------------------------------------------


@pytest.fixture
def admin_client(db: Any) -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "x")
    client = Client()
    client.force_login(user)
    return client


URL = "/admin/provisioning/inventoryguest/"


def test_admin_page_is_read_only_with_filters_and_the_refresh_time(
    sim: Sim, admin_client: Client
) -> None:
    make_cluster("second")  # the cluster filter shows with more than one cluster
    inventory_refresh_all()
    page = admin_client.get(URL).content.decode()
    for title in ("By cluster", "By node", "By type", "By status", "By owner", "By template"):
        assert title in page
    assert 'id="inventory-refreshes"' in page and "never" not in page
    assert "proxy-other" in page and "ct-dns" in page
    assert "/admin/provisioning/inventoryguest/add/" not in page
    assert 'name="action"' not in page
    searched = admin_client.get(URL, {"q": "ct-dns"}).content.decode()
    assert "ct-dns" in searched and "proxy-other" not in searched
    by_vmid = admin_client.get(URL, {"q": "102"}).content.decode()
    assert "proxy-other" in by_vmid and "ct-dns" not in by_vmid
    by_tag = admin_client.get(URL, {"q": "infra"}).content.decode()
    assert "ct-dns" in by_tag and "web-1" not in by_tag
    assert "foreign" in admin_client.get(URL, {"owner__exact": "other"}).content.decode()
    row = InventoryGuest.objects.get(cluster=sim.cluster, vmid=102)
    view = admin_client.get(f"{URL}{row.pk}/change/")
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()
    assert admin_client.get(f"{URL}{row.pk}/delete/").status_code == 403
    assert admin_client.post(f"{URL}{row.pk}/change/", {"name": "x"}).status_code == 403
    assert admin_client.get(f"{URL}add/").status_code == 403


def test_admin_page_shows_a_failed_refresh(sim: Sim, admin_client: Client) -> None:
    inventory_refresh(cluster=sim.cluster)
    sim.engine.control.fail_call("GET", "/cluster/resources", kind="595", times=20)
    inventory_refresh(cluster=sim.cluster)
    page = admin_client.get(URL).content.decode()
    assert 'class="inventory-error"' in page and "the snapshot shown is the previous one" in page


def _rows(cluster: Cluster, count: int) -> None:
    InventoryGuest.objects.bulk_create(
        InventoryGuest(
            cluster=cluster,
            vmid=100000 + i,
            name=f"vm-{i}",
            node=f"pve{1 + i % 3}",
            type="qemu" if i % 5 else "lxc",
            status="running" if i % 2 else "stopped",
            tags="a;b",
            owner=("this", "other", "foreign")[i % 3],
            refreshed_at=cluster.created_at,
        )
        for i in range(count)
    )


def test_admin_page_query_count_does_not_grow_with_the_snapshot(
    sim: Sim, admin_client: Client
) -> None:
    _rows(sim.cluster, 150)
    with CaptureQueriesContext(connection) as small:
        assert admin_client.get(URL).status_code == 200
    _rows(make_cluster("big"), 4096)
    with CaptureQueriesContext(connection) as big:
        page = admin_client.get(URL)
    assert page.status_code == 200
    assert page.content.decode().count('<tr class="inventory-refresh">') == 2
    assert len(big) == len(small) <= 14
