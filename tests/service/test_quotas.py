"""Quotas (issue 11): a cluster's limits on live proxies and on creates in flight, and the
per-user bulk limit. Every refusal names the limit and writes nothing: no proxy row, no
operation, no step message; every limit admits a request that lands exactly on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from pump import Pump, Sim, proxy_spec
from test_admin_bulk import BULK, CONFIRM, _form, _hidden
from test_admin_proxy_form import _add, _change
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning.admin.forms import ProxyForm
from provisioning.models import Cluster, Operation, Proxy, UserQuota
from provisioning.models.choices import OperationKind, OperationState, Phase
from provisioning.services import operations
from provisioning.services.quotas import QuotaExceeded

pytestmark = pytest.mark.django_db

PLACEMENT = ["--cluster", "pvesim", "--machine-type", "small", "--image", "debian-13"]


def _limit(sim: Sim, **limits: int | None) -> None:
    Cluster.objects.filter(pk=sim.cluster.pk).update(**limits)
    sim.cluster.refresh_from_db()


def _declared(pump: Pump, sim: Sim, *names: str) -> None:
    """Proxies declared through the service, their creates still in flight (not pumped)."""
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, n) for n in names])


def _command(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        call_command("proxies", "create", *args)
    return str(caught.value)


class Written:
    """What a refused request must leave unchanged: rows and step messages sent."""

    def __init__(self, pump: Pump) -> None:
        self.pump = pump
        self.before = self.now()

    def now(self) -> tuple[list[str], int, int]:
        names = list(Proxy.objects.order_by("name").values_list("name", flat=True))
        return names, Operation.objects.count(), len(self.pump.queue)

    def unchanged(self) -> bool:
        return self.now() == self.before


# --- maxProxies ----------------------------------------------------------------------------------


def test_a_command_past_max_proxies_is_refused_whole_naming_the_limit(pump: Pump, sim: Sim) -> None:
    _declared(pump, sim, "a", "b", "c")
    _limit(sim, max_proxies=5)
    written = Written(pump)
    message = _command("--count", "3", "--prefix", "web", *PLACEMENT)
    assert (
        "nothing was created: cluster pvesim allows at most 5 proxies (maxProxies); it holds 3 "
        "and this request adds 3" in message
    )
    assert written.unchanged()
    call_command("proxies", "create", "--count", "2", "--prefix", "web", *PLACEMENT)
    assert Proxy.objects.filter(cluster=sim.cluster).count() == 5  # exactly the limit


def test_proxies_being_deleted_make_room_at_once(pump: Pump, sim: Sim) -> None:
    running(pump, sim, "a", "b")
    _limit(sim, max_proxies=2)
    with pytest.raises(QuotaExceeded, match="it holds 2 and this request adds 1"):
        pump.call(operations.proxy_create, spec=proxy_spec(sim, "c"))
    pump.call(operations.proxy_request_delete, proxy=Proxy.objects.get(name="a"))
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "c"))
    assert Proxy.objects.get(name="a").phase == Phase.DELETING
    assert Proxy.objects.filter(name="c").exists()


def test_a_proxies_file_is_counted_per_cluster(pump: Pump, sim: Sim, tmp_path: Path) -> None:
    _limit(sim, max_proxies=1)
    entries = [
        {"name": n, "cluster": "pvesim", "machineType": "small", "image": "debian-13"}
        for n in ("f-1", "f-2")
    ]
    path = tmp_path / "proxies.yaml"
    path.write_text(yaml.safe_dump(entries))
    written = Written(pump)
    message = _command("--file", str(path))
    assert "allows at most 1 proxy (maxProxies); it holds 0 and this request adds 2" in message
    assert written.unchanged()


def test_blank_limits_are_unlimited(pump: Pump, sim: Sim) -> None:
    assert sim.cluster.max_proxies is None and sim.cluster.max_concurrent_creates is None
    call_command("proxies", "create", "--count", "40", "--prefix", "web", *PLACEMENT)
    assert Proxy.objects.count() == 40


def test_zero_refuses_every_new_proxy(pump: Pump, sim: Sim) -> None:
    _limit(sim, max_proxies=0)
    message = _command("solo", *PLACEMENT)
    assert "allows at most 0 proxies (maxProxies); it holds 0 and this request adds 1" in message
    assert not Proxy.objects.exists()


def _add_form_refused_past_one_proxy(sim: Sim, people: People) -> None:
    """The add form posted, answered with the form and the maxProxies limit of 1 named."""
    with posting():
        page = people.client("operator").post(f"{PROXY_LIST}add/", _add(sim))
    assert page.status_code == 200
    assert (
        "cluster pvesim allows at most 1 proxy (maxProxies); it holds 1 and this request adds 1"
        in page.content.decode()
    )


def test_the_admin_add_form_refuses_past_max_proxies(pump: Pump, sim: Sim, people: People) -> None:
    _declared(pump, sim, "a")
    _limit(sim, max_proxies=1)
    written = Written(pump)
    _add_form_refused_past_one_proxy(sim, people)
    assert written.unchanged()


def test_the_bulk_page_refuses_at_preview_and_again_at_confirm(
    pump: Pump, sim: Sim, people: People
) -> None:
    client = people.client("operator")
    _limit(sim, max_proxies=3)
    preview = client.post(BULK, _form(sim, count="3"))
    hidden = _hidden(preview.content.decode())  # fits: exactly the limit
    _declared(pump, sim, "other")  # meanwhile someone took one place
    again = client.post(BULK, _form(sim, count="3"))
    assert "it holds 1 and this request adds 3" in again.content.decode()
    assert b'id="bulk-confirm-form"' not in again.content
    written = Written(pump)
    with posting():
        late = client.post(CONFIRM, hidden, follow=True)
    assert (
        "Nothing was created: cluster pvesim allows at most 3 proxies (maxProxies); it holds 1 "
        "and this request adds 3" in late.content.decode()
    )
    assert written.unchanged()


def test_a_repeated_idempotent_command_is_not_counted_twice(pump: Pump, sim: Sim) -> None:
    _limit(sim, max_proxies=3)
    args = ["--count", "3", "--prefix", "web", *PLACEMENT, "--idempotency-key", "k1"]
    call_command("proxies", "create", *args)
    call_command("proxies", "create", *args)  # the same request again: its proxies are held
    assert Proxy.objects.count() == 3 and Operation.objects.count() == 3


# --- maxConcurrentCreates ------------------------------------------------------------------------


def test_creates_in_flight_are_capped_until_they_finish(pump: Pump, sim: Sim) -> None:
    _limit(sim, max_concurrent_creates=2)
    _declared(pump, sim, "a", "b")  # exactly the limit
    written = Written(pump)
    message = _command("c", *PLACEMENT)
    assert (
        "cluster pvesim allows at most 2 creates in flight (maxConcurrentCreates); 2 are in "
        "flight and this request adds 1" in message
    )
    assert written.unchanged()
    pump.run()  # a and b reach Running: their creates are no longer in flight
    call_command("proxies", "create", "c", "d", *PLACEMENT)
    assert Proxy.objects.count() == 4


def test_both_limits_are_named_when_both_are_passed(pump: Pump, sim: Sim) -> None:
    _declared(pump, sim, "a")
    _limit(sim, max_proxies=1, max_concurrent_creates=1)
    message = _command("b", *PLACEMENT)
    assert "(maxProxies); it holds 1" in message
    assert "(maxConcurrentCreates); 1 is in flight" in message


def test_the_admin_add_form_refuses_past_max_concurrent_creates(
    pump: Pump, sim: Sim, people: People
) -> None:
    _declared(pump, sim, "a")
    _limit(sim, max_concurrent_creates=1)
    written = Written(pump)
    with posting():
        page = people.client("operator").post(f"{PROXY_LIST}add/", _add(sim))
    assert "(maxConcurrentCreates); 1 is in flight and this request adds 1" in (
        page.content.decode()
    )
    assert written.unchanged()


def test_a_replace_counts_as_a_create_in_flight(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    _declared(pump, sim, "busy")
    _limit(sim, max_concurrent_creates=1)
    client = people.client("operator")
    written = Written(pump)
    # The replace action skips it, naming the limit.
    with posting():
        done = client.post(PROXY_LIST, changelist_post("replace", [alpha], post="yes"))
    assert any("alpha" in m and "(maxConcurrentCreates)" in m for m in messages_of(done))
    # Editing its placement would replace it: the change form refuses, the spec is kept.
    with posting():
        page = client.post(f"{PROXY_LIST}{alpha.pk}/change/", _change(alpha, zone="pve3"))
    assert page.status_code == 200
    assert "(maxConcurrentCreates); 1 is in flight and this request adds 1" in (
        page.content.decode()
    )
    assert written.unchanged()
    alpha.refresh_from_db()
    assert alpha.zone == "pve1" and alpha.phase == Phase.RUNNING
    # The service refuses the same way, with nothing changed (the form is only a first check).
    with pytest.raises(QuotaExceeded):
        pump.call(operations.proxy_update, proxy=alpha, zone="pve3")
    alpha.refresh_from_db()
    assert alpha.zone == "pve1" and written.unchanged()


def test_replacing_a_proxy_whose_own_create_is_in_flight_is_allowed(pump: Pump, sim: Sim) -> None:
    _declared(pump, sim, "busy")
    _limit(sim, max_concurrent_creates=1)
    busy = Proxy.objects.get(name="busy")
    op = pump.call(operations.proxy_replace, proxy=busy)
    assert op.kind == OperationKind.REPLACE
    # It superseded the create, so one build is in flight, as before.
    assert Operation.objects.filter(state__in=["queued", "running", "waiting"]).count() == 1
    pump.run()
    busy.refresh_from_db()
    assert busy.phase == Phase.RUNNING


def test_a_retry_that_creates_again_counts(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    Proxy.objects.filter(pk=alpha.pk).update(phase=Phase.FAILED)  # latched
    _declared(pump, sim, "busy")
    _limit(sim, max_concurrent_creates=1)
    written = Written(pump)
    with posting():
        done = people.client("operator").post(PROXY_LIST, changelist_post("provision", [alpha]))
    assert done.status_code == 302
    assert any(
        "alpha" in m and "(maxConcurrentCreates); 1 is in flight" in m for m in messages_of(done)
    )
    assert written.unchanged()
    assert Proxy.objects.get(pk=alpha.pk).phase == Phase.FAILED


def test_a_delete_is_never_held_back_by_a_quota(pump: Pump, sim: Sim) -> None:
    (alpha,) = running(pump, sim, "alpha")
    _declared(pump, sim, "busy")
    _limit(sim, max_proxies=0, max_concurrent_creates=0)
    op = pump.call(operations.proxy_request_delete, proxy=alpha)
    assert op.kind == OperationKind.DELETE and op.state == OperationState.QUEUED


# --- the per-user bulk limit ----------------------------------------------------------------------


@override_settings(PROXYHUB_MAX_BULK_CREATE=3)
def test_commands_get_the_setting(pump: Pump, sim: Sim, tmp_path: Path) -> None:
    written = Written(pump)
    message = _command("--count", "4", "--prefix", "web", *PLACEMENT)
    assert (
        "a command may declare at most 3 proxies in one bulk create (PROXYHUB_MAX_BULK_CREATE); "
        "this request declares 4" in message
    )
    entries = [
        {"name": f"f-{i}", "cluster": "pvesim", "machineType": "small", "image": "debian-13"}
        for i in range(4)
    ]
    path = tmp_path / "proxies.yaml"
    path.write_text(yaml.safe_dump(entries))
    assert "this request declares 4" in _command("--file", str(path))
    assert written.unchanged()
    call_command("proxies", "create", "--count", "3", "--prefix", "web", *PLACEMENT)
    assert Proxy.objects.count() == 3


def test_the_default_bulk_limit_is_100(pump: Pump, sim: Sim) -> None:
    message = _command("--count", "101", "--prefix", "web", *PLACEMENT)
    assert "at most 100 proxies in one bulk create (PROXYHUB_MAX_BULK_CREATE)" in message
    assert not Proxy.objects.exists()


@override_settings(PROXYHUB_MAX_BULK_CREATE=3)
def test_the_bulk_page_applies_the_setting_and_a_users_own_quota(
    pump: Pump, sim: Sim, people: People
) -> None:
    client = people.client("operator")
    page = client.post(BULK, _form(sim, count="4"))
    assert (
        "user olivia may declare at most 3 proxies in one bulk create (PROXYHUB_MAX_BULK_CREATE); "
        "this request declares 4" in page.content.decode()
    )
    assert b'id="bulk-confirm-form"' not in page.content
    quota = UserQuota.objects.create(user=people.operator, max_bulk_create=5)
    preview = client.post(BULK, _form(sim, count="5"))
    hidden = _hidden(preview.content.decode())
    # Lowered between the preview and the confirm: the confirm refuses, naming the user quota.
    quota.max_bulk_create = 2
    quota.save()
    written = Written(pump)
    with posting():
        late = client.post(CONFIRM, hidden, follow=True)
    assert (
        "Nothing was created: user olivia may declare at most 2 proxies in one bulk create "
        "(their user quota); this request declares 5" in late.content.decode()
    )
    assert written.unchanged()
    quota.max_bulk_create = 5
    quota.save()
    with posting():
        client.post(CONFIRM, hidden)
    assert Proxy.objects.count() == 5  # exactly the user's own limit, above the setting's
    # Another user still gets the setting.
    assert (
        "at most 3 proxies"
        in people.client("superuser")
        .post(BULK, _form(sim, count="4", prefix="root"))
        .content.decode()
    )


def test_user_quotas_are_managed_in_the_admin(people: People) -> None:
    client = people.client("superuser")
    listing = client.get("/admin/provisioning/userquota/")
    assert "Users without a row may declare 100 proxies" in listing.content.decode()
    done = client.post(
        "/admin/provisioning/userquota/add/",
        {"user": people.operator.pk, "max_bulk_create": "250"},
    )
    assert done.status_code == 302
    assert UserQuota.objects.get(user=people.operator).max_bulk_create == 250
    zero = client.post(
        "/admin/provisioning/userquota/add/", {"user": people.viewer.pk, "max_bulk_create": "0"}
    )
    assert "greater than or equal to 1" in zero.content.decode()
    # An operator may provision but not raise their own limit.
    assert people.client("operator").get("/admin/provisioning/userquota/").status_code == 403


# --- a quota taken between the form's check and the save ----------------------------------------


def test_a_quota_taken_between_the_add_forms_check_and_its_save_is_shown_on_the_form(
    pump: Pump, sim: Sim, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form checks the quota before the save, the service again under the cluster's lock;
    another declaration committed in between (another operator, a command) must be answered with
    the form and the limit, not an error page."""
    _limit(sim, max_proxies=1)
    checked = ProxyForm._quota_errors

    def check_then_lose_the_race(form: ProxyForm, cluster: Cluster, cleaned: dict) -> None:
        checked(form, cluster, cleaned)  # the place is free when the form looks
        _declared(pump, sim, "other")  # and taken before the save

    monkeypatch.setattr(ProxyForm, "_quota_errors", check_then_lose_the_race)
    _add_form_refused_past_one_proxy(sim, people)
    # Nothing of the refused proxy is written. (The competing declaration, made here inside the
    # view's transaction, is rolled back with it; from another connection it would stay.)
    assert not Proxy.objects.filter(name="alpha").exists()
    assert not Operation.objects.filter(proxy__name="alpha").exists()


def test_a_quota_taken_between_the_change_forms_check_and_its_replace_is_shown_on_the_form(
    pump: Pump, sim: Sim, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    _limit(sim, max_concurrent_creates=1)
    checked = ProxyForm._quota_errors

    def check_then_lose_the_race(form: ProxyForm, cluster: Cluster, cleaned: dict) -> None:
        checked(form, cluster, cleaned)
        _declared(pump, sim, "busy")  # its create is in flight before the replace is admitted

    monkeypatch.setattr(ProxyForm, "_quota_errors", check_then_lose_the_race)
    written_before = Operation.objects.filter(proxy=alpha).count()
    with posting():
        page = people.client("operator").post(
            f"{PROXY_LIST}{alpha.pk}/change/", _change(alpha, zone="pve2")
        )
    assert page.status_code == 200
    assert "(maxConcurrentCreates); 1 is in flight and this request adds 1" in (
        page.content.decode()
    )
    alpha.refresh_from_db()
    assert alpha.zone == "pve1"
    assert Operation.objects.filter(proxy=alpha).count() == written_before
