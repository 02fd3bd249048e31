"""Who may do what in the console, and what a refused request leaves behind: nothing.

Every action is POSTed directly, confirm included, by each kind of user issue 5 names. A
refusal is a 403, writes no operation, sends no step message and shows no message. Every
state-changing view checks CSRF, and the bulk-create confirm URL answers 405 to GET.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from pump import Pump, Sim
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning import sealed_tokens
from provisioning.admin.views import BULK_PURPOSE
from provisioning.models import Operation, Proxy

pytestmark = pytest.mark.django_db

ACTIONS = (
    "provision",
    "replace",
    "start",
    "shutdown",
    "reboot",
    "delete_vms",
    "preview_plan",
    "preflight",
)
# What each kind of user may run (issue 5: operator = provision, power and check).
ALLOWED = {
    "superuser": set(ACTIONS),
    "operator": set(ACTIONS) - {"delete_vms"},
    "viewer": set(),
    "staff": set(),
}
REFUSED = [
    (who, action) for who, allowed in ALLOWED.items() for action in ACTIONS if action not in allowed
]


@pytest.mark.parametrize(("who", "action"), REFUSED)
def test_an_action_posted_without_its_permission_is_refused_and_does_nothing(
    pump: Pump, sim: Sim, people: People, who: str, action: str
) -> None:
    # A row as a Running proxy's: the refusal must come before anything looks at Proxmox.
    alpha = Proxy.objects.create(
        name="alpha",
        cluster=sim.cluster,
        machine_type="small",
        image="debian-13",
        phase="Running",
        provider_id="vms/150000/proxy-alpha",
        vmid=150000,
        node="pve1",
    )
    before = Operation.objects.count()
    client = people.client(who)
    with posting():
        first = client.post(PROXY_LIST, changelist_post(action, [alpha]))
        confirm = client.post(PROXY_LIST, changelist_post(action, [alpha], post="yes"))
    assert (first.status_code, confirm.status_code) == (403, 403)
    assert Operation.objects.count() == before
    assert pump.queue == []
    assert messages_of(confirm) == []
    alpha.refresh_from_db()
    assert alpha.phase == "Running"


@pytest.mark.parametrize("who", ["superuser", "operator", "viewer"])
def test_the_action_menu_offers_exactly_what_the_user_may_run(
    sim: Sim, people: People, who: str
) -> None:
    Proxy.objects.create(name="alpha", cluster=sim.cluster, machine_type="small", image="debian-13")
    page = people.client(who).get(PROXY_LIST)
    assert page.status_code == 200
    offered = {a for a in ACTIONS if f'value="{a}"'.encode() in page.content}
    assert offered == ALLOWED[who]


def test_staff_without_permissions_sees_no_page(people: People) -> None:
    client = people.client("staff")
    for url in (
        PROXY_LIST,
        "/admin/provisioning/operation/",
        "/admin/provisioning/cluster/",
        f"{PROXY_LIST}bulk-create/",
    ):
        assert client.get(url).status_code == 403, url


def test_a_viewer_reads_but_cannot_add_change_or_delete(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("viewer")
    change = client.get(f"{PROXY_LIST}{alpha.pk}/change/")
    assert change.status_code == 200
    assert b'name="zone"' not in change.content and b"cloud_init_text" not in change.content
    before = Operation.objects.count()
    with posting():
        edit = client.post(f"{PROXY_LIST}{alpha.pk}/change/", {"zone": "pve2"})
        add = client.post(
            f"{PROXY_LIST}add/",
            {
                "name": "beta",
                "cluster": sim.cluster.pk,
                "machine_type": "small",
                "image": "debian-13",
            },
        )
        delete = client.post(f"{PROXY_LIST}{alpha.pk}/delete/", {"post": "yes"})
        bulk = client.post(
            f"{PROXY_LIST}bulk-create/confirm/", _bulk_confirm(sim, people.viewer.pk)
        )
    assert [r.status_code for r in (edit, add, delete, bulk)] == [403, 403, 403, 403]
    assert Operation.objects.count() == before and pump.queue == []
    assert list(Proxy.objects.values_list("name", "zone")) == [("alpha", "pve1")]


def test_an_operator_may_not_delete_through_the_change_page(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    assert client.get(f"{PROXY_LIST}{alpha.pk}/delete/").status_code == 403
    with posting():
        refused = client.post(f"{PROXY_LIST}{alpha.pk}/delete/", {"post": "yes"})
    assert refused.status_code == 403
    assert Operation.objects.filter(kind="delete").count() == 0 and pump.queue == []


def test_cluster_actions_need_the_check_permission(sim: Sim, people: People) -> None:
    data = {"action": "check_now", "_selected_action": [str(sim.cluster.pk)]}
    with posting():
        refused = people.client("viewer").post("/admin/provisioning/cluster/", data)
    assert refused.status_code == 403
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("action", ["shutdown", "delete_vms", "provision"])
def test_a_confirm_without_the_csrf_token_is_refused(
    pump: Pump, sim: Sim, people: People, action: str
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    before = Operation.objects.count()
    client = people.client("superuser", csrf=True)
    with posting():
        response = client.post(PROXY_LIST, changelist_post(action, [alpha], post="yes"))
    assert response.status_code == 403
    assert Operation.objects.count() == before and pump.queue == []


def test_every_state_changing_view_checks_csrf(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    before = Operation.objects.count()
    client = people.client("superuser", csrf=True)
    with posting():
        responses = [
            client.post(f"{PROXY_LIST}{alpha.pk}/delete/", {"post": "yes"}),
            client.post(f"{PROXY_LIST}{alpha.pk}/change/", {"zone": "pve2"}),
            client.post(
                f"{PROXY_LIST}bulk-create/confirm/", _bulk_confirm(sim, people.superuser.pk)
            ),
            client.post(
                "/admin/provisioning/cluster/",
                {"action": "check_now", "_selected_action": [str(sim.cluster.pk)]},
            ),
        ]
    assert [r.status_code for r in responses] == [403] * 4
    assert Operation.objects.count() == before and pump.queue == []
    assert Proxy.objects.count() == 1


def test_the_bulk_confirm_url_answers_405_to_get(sim: Sim, people: People) -> None:
    for who in ("superuser", "operator"):
        response = people.client(who).get(f"{PROXY_LIST}bulk-create/confirm/")
        assert response.status_code == 405
    assert not Proxy.objects.exists()


def test_accepted_actions_are_journalled_with_the_user(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha, beta = running(pump, sim, "alpha", "beta")
    with posting():
        people.client("operator").post(PROXY_LIST, changelist_post("reboot", [alpha], post="yes"))
        people.client("superuser").post(
            PROXY_LIST, changelist_post("delete_vms", [beta], post="yes")
        )
    journal = Operation.objects.exclude(kind="create").order_by("kind")
    assert [(o.kind, o.proxy_name, o.requested_by.username, o.requested_via) for o in journal] == [
        ("delete", "beta", "root", "admin"),
        ("reboot", "alpha", "olivia", "admin"),
    ]


def _bulk_confirm(sim: Sim, user_id: int) -> dict[str, str]:
    """What the bulk-create preview posts to the confirm URL, with a token valid for
    ``user_id``: only the permission (or CSRF) check stands between it and a create."""
    return {
        "count": "2",
        "prefix": "web",
        "cluster": str(sim.cluster.pk),
        "machine_type": "small",
        "image": "debian-13",
        "zone": "pve1",
        "cloud_init_token": sealed_tokens.token_dumps(b"", purpose=BULK_PURPOSE, user_id=user_id),
    }
