"""Secrets posted through the console go nowhere they should not (issue 11, errors and logs).

With DEBUG on, a unique canary is posted through every page of the console that takes input:
the login form (a wrong password), the proxy add form (pasted, uploaded, and refused with a form
error), the proxy change form (new cloud-init), bulk create and its confirmation (and a refused
preview), every proxy action and its confirmation page, the cluster actions, Django's user add
form (a password), and a request that raises (a test-only URL below, holding the upload the
way the add form does). Secret-named fields ride along on the action posts too.

Then every place a secret could leak is searched for every canary:

* every response, the pages the redirects lead to (where the messages are shown), and their
  headers and cookies;
* every log record of every logger at DEBUG (SQL with its parameters included), as emitted,
  before any handler's redaction;
* every message the posts published, read back from a real Redis (Celery's full envelope:
  headers, properties, body);
* every column of every table, found by introspection, and the decoded session data.

Cloud-init is stored sealed (ciphertext), so no column holds a canary in clear, and the test
checks that the pasted and uploaded cloud-init did arrive, byte for byte, behind the seal.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from pump import Sim
from redis_broker import broker, queue_messages
from test_admin_bulk import _hidden
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    people_fixture,  # noqa: F401
    posting,
)

from provisioning.admin.forms import ProxyForm
from provisioning.models import Proxy
from proxyhub.urls import urlpatterns as production_urls

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__), pytest.mark.timeout(240)]

BULK = f"{PROXY_LIST}bulk-create/"
CLUSTERS = "/admin/provisioning/cluster/"
PROXY_ACTIONS = (
    "provision",
    "replace",
    "start",
    "shutdown",
    "reboot",
    "preview_plan",
    "preflight",
    "delete_vms",
)


def canary(where: str) -> str:
    """One canary per entry point, so a failure names the form that leaked."""
    return f"CANARY-{where}-3f9d27b1"


def user_data(where: str) -> str:
    return f"#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: {canary(where)}\n"


def raising_view(request: HttpRequest) -> HttpResponse:
    """Parses the add form as the admin does, keeps the cloud-init in locals, then fails."""
    form = ProxyForm(request.POST, request.FILES)
    form.is_valid()
    upload = request.FILES["cloud_init_file"]
    upload.seek(0)
    body = upload.read()
    text = body.decode()  # noqa: F841 (a str local named innocently)
    raise RuntimeError("saving the proxy failed")


urlpatterns = [path("boom/", raising_view), *production_urls]


class Console:
    """A logged-in client that keeps every response and follows every redirect, so the
    messages shown on the next page are searched too."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: list[str] = []

    def _keep(self, response: Any) -> Any:
        cookies = "; ".join(f"{k}={v.value}" for k, v in response.cookies.items())
        headers = json.dumps(dict(response.headers))
        self.seen.append(response.content.decode(errors="replace") + headers + cookies)
        if response.status_code == 302:
            self._keep(self.client.get(response["Location"]))
        return response

    def post(self, url: str, data: dict[str, Any]) -> Any:
        with posting():
            return self._keep(self.client.post(url, data))

    def get(self, url: str) -> Any:
        return self._keep(self.client.get(url))


def _riders(where: str) -> dict[str, str]:
    """Secret-named fields a form does not expect, posted along with an action."""
    return {
        "cloud_init_text": user_data(f"{where}-paste"),
        "user-data": canary(f"{where}-user-data"),
        "vendorData": canary(f"{where}-vendor"),
        "api_token": canary(f"{where}-token"),
    }


def _proxy_form(sim: Sim, name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "cluster": sim.cluster.pk,
        "zone": "pve1",
        "machine_type": "small",
        "image": "debian-13",
        **fields,
    }


def _post_everything(console: Console, anonymous: Client, sim: Sim) -> list[str]:
    """Posts a canary through every form; returns the canaries posted."""
    posted: list[str] = []

    def note(*names: str) -> None:
        posted.extend(canary(n) for n in names)

    # The login form, with a wrong password (django-axes records the attempt).
    login = anonymous.post(
        "/admin/login/?next=/admin/", {"username": "root", "password": canary("login")}
    )
    assert login.status_code == 200
    console.seen.append(login.content.decode())
    note("login")

    # The proxy add form: pasted, uploaded, and refused with a form error.
    added = console.post(
        f"{PROXY_LIST}add/", _proxy_form(sim, "pasted", cloud_init_text=user_data("add-paste"))
    )
    assert added.status_code == 302
    upload = SimpleUploadedFile("user-data", user_data("add-upload").encode())
    assert (
        console.post(
            f"{PROXY_LIST}add/", _proxy_form(sim, "uploaded", cloud_init_file=upload)
        ).status_code
        == 302
    )
    refused = console.post(
        f"{PROXY_LIST}add/",
        _proxy_form(sim, "refused", zone="nowhere", cloud_init_text=user_data("add-refused")),
    )
    assert refused.status_code == 200 and "errornote" in refused.content.decode()
    note("add-paste", "add-upload", "add-refused")

    # The change form, with new cloud-init (replaces the VM).
    proxy = Proxy.objects.get(name="pasted")
    changed = console.post(
        f"{PROXY_LIST}{proxy.pk}/change/",
        {
            "zone": proxy.zone,
            "machine_type": proxy.machine_type,
            "image": proxy.image,
            "cloud_init_text": user_data("change"),
        },
    )
    assert changed.status_code == 302
    note("change")

    # Bulk create: the preview (an upload), its confirmation, and a refused preview.
    preview = console.post(
        BULK,
        {
            "count": "2",
            "prefix": "bulk",
            "cluster": sim.cluster.pk,
            "machine_type": "small",
            "image": "debian-13",
            "zone": "",
            "cloud_init_file": SimpleUploadedFile("user-data", user_data("bulk").encode()),
        },
    )
    assert preview.status_code == 200
    confirmed = console.post(f"{BULK}confirm/", _hidden(preview.content.decode()))
    assert confirmed.status_code == 302
    bulk_refused = console.post(
        BULK,
        {
            "count": "0",
            "prefix": "bulk",
            "cluster": sim.cluster.pk,
            "machine_type": "small",
            "image": "debian-13",
            "cloud_init_text": user_data("bulk-refused"),
        },
    )
    assert bulk_refused.status_code == 200
    note("bulk", "bulk-refused")

    # Every proxy action, and its confirmation page when it has one.
    targets = list(Proxy.objects.filter(name__in=["uploaded", "bulk-1"]))
    for action in PROXY_ACTIONS:
        riders = _riders(action)
        first = console.post(PROXY_LIST, {**changelist_post(action, targets), **riders})
        assert first.status_code in (200, 302), action
        key = (first.context or {}).get("idempotency_key") if first.status_code == 200 else None
        if key:
            done = console.post(
                PROXY_LIST,
                {
                    **changelist_post(action, targets, post="yes", idempotency_key=key),
                    **riders,
                },
            )
            assert done.status_code in (200, 302), action
        note(f"{action}-paste", f"{action}-user-data", f"{action}-vendor", f"{action}-token")

    # The cluster actions.
    for action in ("check_now", "preflight"):
        riders = _riders(f"cluster-{action}")
        page = console.post(
            CLUSTERS, {"action": action, "_selected_action": [str(sim.cluster.pk)], **riders}
        )
        assert page.status_code in (200, 302), action
        note(*(f"cluster-{action}-{k}" for k in ("paste", "user-data", "vendor", "token")))

    # Django's user add form: a password.
    password = canary("user-password") + "-Aa9!"
    user_added = console.post(
        "/admin/auth/user/add/",
        {
            "username": "newcomer",
            "password1": password,
            "password2": password,
            "usable_password": "true",
        },
    )
    assert user_added.status_code == 302, user_added.content.decode()[:2000]
    note("user-password")

    # A request that raises, with DEBUG on: the technical 500 page.
    boom = console.client.post(
        "/boom/",
        {
            **_proxy_form(sim, "boom"),
            "cloud_init_file": SimpleUploadedFile("user-data", user_data("boom").encode()),
        },
    )
    assert boom.status_code == 500 and "saving the proxy failed" in boom.content.decode()
    console.seen.append(boom.content.decode())
    note("boom")
    return posted


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    formatter = logging.Formatter()
    lines = []
    for record in caplog.records:
        lines.append(record.getMessage())
        lines.append(json.dumps(vars(record), default=repr))
        if record.exc_info:
            lines.append(formatter.formatException(record.exc_info))
    return "\n".join(lines)


def _database_text() -> dict[str, str]:
    """``table.column`` -> every value of that column, as text (binary as latin-1), found by
    introspection; sessions also decoded."""
    found: dict[str, list[str]] = {}
    quote, introspection = connection.ops.quote_name, connection.introspection
    with connection.cursor() as cursor:
        for table in introspection.table_names(cursor):
            columns = [c.name for c in introspection.get_table_description(cursor, table)]
            # Names from the database's own catalogue, quoted: no input reaches this query.
            select = f"SELECT {', '.join(map(quote, columns))} FROM {quote(table)}"  # noqa: S608
            cursor.execute(select)
            for row in cursor.fetchall():
                for column, value in zip(columns, row, strict=True):
                    if isinstance(value, memoryview):
                        value = value.tobytes()
                    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
                    found.setdefault(f"{table}.{column}", []).append(text)
    sessions = [
        json.dumps(SessionStore().decode(data), default=str)
        for data in found.get("django_session.session_data", [])
    ]
    found["django_session (decoded)"] = sessions
    return {where: "\n".join(values) for where, values in found.items()}


def _all_loggers_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in list(logging.root.manager.loggerDict):
        caplog.set_level(logging.DEBUG, logger=name)


def test_a_canary_posted_through_every_form_is_found_nowhere(
    sim: Sim,
    people: People,
    live_broker: str,
    live_queue: Any,
    caplog: pytest.LogCaptureFixture,
    settings: Any,
) -> None:
    settings.DEBUG = True
    _all_loggers_at_debug(caplog)
    console = Console(people.client("superuser"))
    console.client.raise_request_exception = False
    with broker(live_broker):
        posted = _post_everything(console, Client(), sim)
    messages = queue_messages(live_queue)

    assert len(posted) > 40
    # The posts did reach the queue and the database, so the searches below look at real data.
    assert {m["task"] for m in messages} >= {"proxyhub.provisioning.step"}
    assert Proxy.objects.get(name="uploaded").cloud_init == user_data("add-upload").encode()
    assert Proxy.objects.get(name="pasted").cloud_init == user_data("change").encode()
    assert Proxy.objects.get(name="bulk-2").cloud_init == user_data("bulk").encode()

    haystacks = {
        "pages": "\n".join(console.seen),
        "logs": _log_text(caplog),
        "broker": json.dumps(messages),
    }
    for where, text in haystacks.items():
        leaked = [c for c in posted if c in text]
        assert not leaked, f"{leaked} in {where}"
    for column, text in _database_text().items():
        leaked = [c for c in posted if c in text]
        assert not leaked, f"{leaked} in the database column {column}"


def test_vendor_data_posted_through_the_cluster_form_is_found_nowhere(
    sim: Sim, people: People, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    from test_admin_clusters import _as_saved  # the change form as the page would post it

    settings.DEBUG = True
    _all_loggers_at_debug(caplog)
    console = Console(people.client("superuser"))
    vendor = "#cloud-config\npackages: [qemu-guest-agent]\n# " + canary("vendor") + "\n"
    url = f"{CLUSTERS}{sim.cluster.pk}/change/"
    done = console.post(url, {**_as_saved(sim.cluster), "vendor_data": vendor})
    assert done.status_code == 302
    console.get(url)
    texts = {"pages": "\n".join(console.seen), "logs": _log_text(caplog), **_database_text()}
    leaked = [where for where, text in texts.items() if canary("vendor") in text]
    assert not leaked, f"vendor-data canary in {leaked}"
