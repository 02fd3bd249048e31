"""The proxy and operation lists cost the same number of queries whatever the page size, over
10,000 proxies and 10,000 operations; no change form renders a dropdown over a big table.

NetBox keeps query-count baselines per view; here the baseline is the page at 100 rows and the
same page at 1000 rows must not cost one query more.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from test_admin_support import People, people_fixture  # noqa: F401

from provisioning.admin.operations import OperationAdmin
from provisioning.admin.proxies import ProxyAdmin
from provisioning.models import (
    Cluster,
    MachineType,
    Node,
    Operation,
    OperationStep,
    Proxy,
    Template,
)

pytestmark = pytest.mark.django_db

FLEET = 10_000
# What one list page may cost: session, user, the rows, the counts and the filters' choices.
MAX_QUERIES = 14


@pytest.fixture(scope="module")
def fleet(django_db_setup: Any, django_db_blocker: Any) -> Iterator[Cluster]:
    """The fleet is written once for the module and removed after it (pytest-django's
    documented way to share data between tests); each test still runs in its own transaction."""
    with django_db_blocker.unblock():
        cluster = _build_fleet()
        try:
            yield cluster
        finally:
            Operation.objects.filter(cluster=cluster).delete()
            Proxy.objects.filter(cluster=cluster).delete()
            cluster.delete()
            User.objects.filter(username="bulk").delete()


def _build_fleet() -> Cluster:
    cluster = Cluster.objects.create(
        name="big", url="https://10.0.0.1:8006", token_file="/t", iso_storage="proxy-seeds"
    )
    for i, node in enumerate(("pve1", "pve2", "pve3", "pve4")):
        Node.objects.create(cluster=cluster, name=node, position=i)
    Template.objects.create(cluster=cluster, key="debian-13", vmid=9000)
    MachineType.objects.create(cluster=cluster, key="small", cores=1, memory_mib=1024)
    asker = User.objects.create_user(username="bulk")
    proxies = Proxy.objects.bulk_create(
        Proxy(
            name=f"p-{i:05d}",
            uid=uuid.uuid4(),
            cluster=cluster,
            machine_type="small",
            image="debian-13",
            phase="Running" if i % 7 else "Failed",
            node=f"pve{1 + i % 4}",
            vmid=100000 + i,
            provider_id=f"vms/{100000 + i}/proxy-p-{i:05d}",
            ip=f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}",
            last_error="" if i % 7 else "clone failed: " + "x" * 120,
        )
        for i in range(FLEET)
    )
    Operation.objects.bulk_create(
        Operation(
            kind="create",
            proxy=proxy,
            proxy_name=proxy.name,
            cluster=cluster,
            requested_by=asker,
            requested_via="admin",
            state="succeeded",
        )
        for proxy in proxies
    )
    return cluster


def _queries(client: Any, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    ("admin_class", "url", "query"),
    [
        (ProxyAdmin, "/admin/provisioning/proxy/", ""),
        (ProxyAdmin, "/admin/provisioning/proxy/", "?phase__exact=Failed&node=pve2"),
        (ProxyAdmin, "/admin/provisioning/proxy/", "?q=p-0"),
        (OperationAdmin, "/admin/provisioning/operation/", ""),
        (OperationAdmin, "/admin/provisioning/operation/", "?state__exact=succeeded"),
    ],
)
def test_a_list_costs_the_same_at_100_and_1000_rows(
    fleet: Cluster,
    people: People,
    monkeypatch: pytest.MonkeyPatch,
    django_assert_max_num_queries: Any,
    admin_class: type,
    url: str,
    query: str,
) -> None:
    client = people.client("operator")
    counts = {}
    for per_page in (100, 1000):
        monkeypatch.setattr(admin_class, "list_per_page", per_page)
        with django_assert_max_num_queries(MAX_QUERIES):
            counts[per_page] = _queries(client, url + query)
    assert counts[100] == counts[1000], counts


def test_the_full_page_really_holds_1000_rows(
    fleet: Cluster, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ProxyAdmin, "list_per_page", 1000)
    body = people.client("operator").get("/admin/provisioning/proxy/").content.decode()
    assert body.count('name="_selected_action"') == 1000
    assert "10000 proxies" in body or "10,000" in body


def test_no_form_renders_a_dropdown_over_a_big_table(fleet: Cluster, people: People) -> None:
    client = people.client("superuser")
    proxy = Proxy.objects.get(name="p-00042")
    op = Operation.objects.get(proxy=proxy)
    OperationStep.objects.create(
        operation=op, seq=1, name="lookup", state="succeeded", started_at=op.created_at
    )
    for url in (
        "/admin/provisioning/proxy/add/",
        f"/admin/provisioning/proxy/{proxy.pk}/change/",
        f"/admin/provisioning/operation/{op.pk}/change/",
        f"/admin/provisioning/cluster/{fleet.pk}/change/",
        "/admin/provisioning/proxy/bulk-create/",
    ):
        body = client.get(url).content.decode()
        for select in re.findall(r"<select[^>]*>.*?</select>", body, flags=re.S):
            options = select.count("<option")
            assert options < 50, f"{url}: a select with {options} options"
    add = client.get("/admin/provisioning/proxy/add/").content.decode()
    assert "admin-autocomplete" in add  # the cluster is picked by autocomplete


def test_the_change_page_of_a_proxy_with_many_operations_stays_cheap(
    fleet: Cluster, people: People
) -> None:
    proxy = Proxy.objects.get(name="p-00007")
    Operation.objects.bulk_create(
        # A long history: finished operations (a proxy has at most one unfinished).
        Operation(
            kind="reboot", state="succeeded", proxy=proxy, proxy_name=proxy.name, cluster=fleet
        )
        for _ in range(200)
    )
    client = people.client("operator")
    count = _queries(client, f"/admin/provisioning/proxy/{proxy.pk}/change/")
    assert count <= MAX_QUERIES
    body = client.get(f"/admin/provisioning/proxy/{proxy.pk}/change/").content.decode()
    assert f"?proxy__id__exact={proxy.pk}" in body  # the rest are one link away
    listing = client.get(f"/admin/provisioning/operation/?proxy__id__exact={proxy.pk}")
    assert listing.status_code == 200 and "201 operations" in listing.content.decode()
