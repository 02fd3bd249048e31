"""The proxy and operation lists cost the same number of queries whatever the page size, over
10,000 proxies and 10,000 operations; no change form renders a dropdown over a big table.

NetBox keeps query-count baselines per view; here the baseline is the page at 100 rows and the
same page at 1000 rows must not cost one query more. The proxy list has its own, tighter
baseline (issue 12: at most 8 queries at 100,000 proxies): no filter's choices scan the proxy
table, the table is counted once, and on PostgreSQL an unfiltered list above
``changelist.ESTIMATE_FROM`` rows shows the planner's estimate instead of counting.
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

from provisioning.admin import changelist
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
# The proxy list's baseline (issue 12): session, user, the user's two permission queries (none
# for a superuser), the clusters (banners and cluster filter), the catalogue (node, machine type
# and image filters), the count and the rows; and the maintenance banner's one read of the
# switches that are on (issue 14), which every admin page makes.
PROXY_LIST_MAX_QUERIES = 9
PROXY_LIST_PAGES = ("", "?phase__exact=Failed&node=pve2", "?q=p-0", "?image=debian-13&p=2")


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


def _captured(client: Any, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.status_code
    return [query["sql"] for query in ctx.captured_queries]


@pytest.mark.parametrize("who", ["superuser", "operator"])
@pytest.mark.parametrize("query", PROXY_LIST_PAGES)
def test_the_proxy_list_stays_within_its_query_baseline(
    fleet: Cluster, people: People, who: str, query: str
) -> None:
    sqls = _captured(people.client(who), "/admin/provisioning/proxy/" + query)
    assert len(sqls) <= PROXY_LIST_MAX_QUERIES, "\n".join(sqls)
    proxy_table = [sql for sql in sqls if 'FROM "provisioning_proxy"' in sql]
    # The rows and one count; never a DISTINCT scan for a filter's choices, never a 2nd count.
    assert not [sql for sql in proxy_table if "DISTINCT" in sql], proxy_table
    assert sum("COUNT(" in sql for sql in sqls) <= 1, sqls


def test_the_filters_offer_the_catalogue_and_filter_the_rows(
    fleet: Cluster, people: People
) -> None:
    # A second cluster (Django shows the cluster filter from two choices on), with a node and
    # an image of its own: the sidebar lists every cluster's catalogue.
    other = Cluster.objects.create(
        name="small", url="https://10.0.0.2:8006", token_file="/t", iso_storage="proxy-seeds"
    )
    Node.objects.create(cluster=other, name="edge1", position=0)
    Template.objects.create(cluster=other, key="alpine-3", vmid=9001)
    client = people.client("operator")
    body = client.get("/admin/provisioning/proxy/").content.decode()
    for choice in ("?node=pve1", "?node=pve4", "?node=edge1", "?machine_type=small"):
        assert f'href="{choice}"' in body, choice
    assert 'href="?image=debian-13"' in body and 'href="?image=alpine-3"' in body
    for cluster in (fleet, other):
        assert f'href="?cluster__id__exact={cluster.pk}"' in body
    # A value the catalogue does not hold (a node taken out of it) stays offered while chosen.
    Proxy.objects.filter(name="p-00042").update(node="pve9")
    gone = client.get("/admin/provisioning/proxy/?node=pve9").content.decode()
    assert 'href="?node=pve9"' in gone and "p-00042" in gone
    assert "1 proxy" in gone
    failed = client.get("/admin/provisioning/proxy/?phase__exact=Failed&node=pve2").content.decode()
    expected = sum(1 for i in range(FLEET) if i % 7 == 0 and 1 + i % 4 == 2)
    assert f"{expected} proxies" in failed and "about" not in failed


def test_a_big_unfiltered_list_on_postgresql_shows_an_estimate_and_says_so(
    fleet: Cluster, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the estimate is PostgreSQL's (pg_class.reltuples); SQLite counts")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE provisioning_proxy")  # as autovacuum would for a big table
    monkeypatch.setattr(changelist, "ESTIMATE_FROM", 1000)
    client = people.client("operator")
    sqls = _captured(client, "/admin/provisioning/proxy/")
    assert not [sql for sql in sqls if sql.startswith('SELECT COUNT(*) AS "__count"')], sqls
    assert len(sqls) <= PROXY_LIST_MAX_QUERIES
    body = client.get("/admin/provisioning/proxy/").content.decode()
    assert 'id="estimated-count"' in body and "about 10000 proxies (an estimate)" in body
    assert "Select all (about 10000) proxies" in body
    # Every page of the estimate opens, the last one included, and one past it is empty.
    last = client.get("/admin/provisioning/proxy/?p=100").content.decode()
    assert "p-09999" in last
    past = client.get("/admin/provisioning/proxy/?p=101")
    assert past.status_code == 200 and "p-0" not in past.content.decode().split("result_list")[-1]
    # A filtered list is counted, exactly, and says nothing of an estimate.
    filtered = client.get("/admin/provisioning/proxy/?phase__exact=Failed").content.decode()
    assert f"{sum(1 for i in range(FLEET) if i % 7 == 0)} proxies" in filtered
    assert "estimated-count" not in filtered


def test_below_the_threshold_postgresql_counts_exactly(fleet: Cluster, people: People) -> None:
    body = people.client("operator").get("/admin/provisioning/proxy/").content.decode()
    assert "10000 proxies" in body and "estimated-count" not in body


@pytest.mark.parametrize("name", ["p-00001", "a<b\"&'c"])
def test_the_row_checkbox_is_djangos_own_markup(name: str) -> None:
    """The list writes the row checkbox directly (a template render per row was a quarter of
    the page's time); the markup must stay byte for byte what Django's widget renders, since
    the admin's actions.js finds rows by it."""
    from django.contrib import admin

    proxy = Proxy(pk=4242, name=name)
    expected = admin.ModelAdmin.action_checkbox(admin.site._registry[Proxy], proxy)
    assert str(changelist.action_checkbox(proxy)) == str(expected)


@pytest.mark.parametrize(
    ("field", "index"), [("image", "proxy_image_idx"), ("machine_type", "proxy_machine_type_idx")]
)
def test_a_rare_machine_type_or_image_is_found_through_its_index(
    fleet: Cluster, people: People, field: str, index: str
) -> None:
    """Migration 0014: the list's machine type and image filters read an index, not the whole
    table (PostgreSQL's plan for the page's own count query)."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    Proxy.objects.filter(name__in=[f"p-0{i:04d}" for i in range(20)]).update(**{field: "rare"})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE provisioning_proxy")
    sqls = _captured(people.client("operator"), f"/admin/provisioning/proxy/?{field}=rare")
    count = next(sql for sql in sqls if sql.startswith('SELECT COUNT(*) AS "__count"'))
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + count)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert index in plan, plan
