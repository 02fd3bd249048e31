"""The bulk-create page: the names first, nothing written until the confirm, then every proxy
created through ``proxies_create`` with the uploaded cloud-init byte for byte."""

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
    messages_of,
    people_fixture,  # noqa: F401
    posting,
)

from provisioning import sealed_tokens, sealing
from provisioning.admin.views import BULK_PURPOSE
from provisioning.models import Operation, Proxy

pytestmark = pytest.mark.django_db

BULK = f"{PROXY_LIST}bulk-create/"
CONFIRM = f"{BULK}confirm/"


def _form(sim: Sim, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "count": "3",
        "prefix": "web",
        "cluster": sim.cluster.pk,
        "machine_type": "small",
        "image": "debian-13",
        "zone": "",
        "cloud_init_file": SimpleUploadedFile("user-data", CLOUD_INIT.encode()),
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def _hidden(html: str) -> dict[str, str]:
    import re

    form = html.split('id="bulk-confirm-form"', 1)[1].split("</form>", 1)[0]
    out = {}
    for tag in re.findall(r'<input type="hidden"[^>]*>', form):
        name = re.search(r'name="([^"]+)"', tag).group(1)  # type: ignore[union-attr]
        value = re.search(r'value="([^"]*)"', tag)
        if name != "csrfmiddlewaretoken":
            out[name] = value.group(1) if value else ""
    return out


def test_the_list_links_the_bulk_page(people: People) -> None:
    assert (
        b'href="/admin/provisioning/proxy/bulk-create/"'
        in people.client("operator").get(PROXY_LIST).content
    )
    assert b"bulk-create" not in people.client("viewer").get(PROXY_LIST).content


def test_preview_lists_the_names_and_writes_nothing(sim: Sim, people: People) -> None:
    client = people.client("operator")
    assert client.get(BULK).status_code == 200
    preview = client.post(BULK, _form(sim, count="12"))
    assert preview.status_code == 200
    text = preview.content.decode()
    names = [f"web-{i:02d}" for i in range(1, 13)]
    for name in names:
        assert f"<li>{name}</li>" in text
    assert f"{len(CLOUD_INIT.encode())} bytes, HMAC-SHA256" in text
    assert sealing.digest(CLOUD_INIT.encode()) in text
    assert CLOUD_INIT_CANARY not in text
    assert "chosen by placement" in text  # the first VM's plan, with a blank zone
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_confirm_creates_every_proxy_and_they_run(
    pump: Pump, sim: Sim, people: People, settings: Any
) -> None:
    settings.PROXYHUB_KEEP_SEED_ISO = True  # each seed is read back below
    client = people.client("operator")
    preview = client.post(BULK, _form(sim))
    hidden = _hidden(preview.content.decode())
    assert set(hidden) == {
        "count",
        "prefix",
        "cluster",
        "machine_type",
        "image",
        "zone",
        "cloud_init_token",
        "plan_hash",
        "plan_shown",
    }
    with posting():
        done = client.post(CONFIRM, hidden)
    assert done.status_code == 302 and done["Location"] == PROXY_LIST
    assert messages_of(done) == ["Creating 3 proxies: web-1, web-2, web-3."]
    proxies = list(Proxy.objects.order_by("name"))
    assert [p.name for p in proxies] == ["web-1", "web-2", "web-3"]
    assert all(p.cloud_init == CLOUD_INIT.encode() for p in proxies)
    ops = Operation.objects.order_by("proxy_name")
    assert [(o.kind, o.requested_by.username, o.requested_via) for o in ops] == [
        ("create", "olivia", "admin")
    ] * 3
    pump.run()
    assert set(Proxy.objects.values_list("phase", flat=True)) == {"Running"}
    # A blank zone spreads the batch over the nodes (placement), and each seed carries the
    # uploaded user-data.
    assert {p.node for p in Proxy.objects.all()} == {"pve1", "pve2", "pve3"}
    for proxy in Proxy.objects.all():
        seed = sim.engine.control.volume_data(proxy.node, seed_volid_of(proxy))
        assert seed is not None and CLOUD_INIT_CANARY.encode() in seed


def test_pasted_cloud_init_is_kept_byte_for_byte(sim: Sim, people: People) -> None:
    client = people.client("operator")
    pasted = CLOUD_INIT.replace("\n", "\r\n")  # as a browser sends a textarea
    preview = client.post(BULK, _form(sim, count="1", cloud_init_file=None, cloud_init_text=pasted))
    with posting():
        client.post(CONFIRM, _hidden(preview.content.decode()))
    assert Proxy.objects.get().cloud_init == CLOUD_INIT.encode()


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"machine_type": "huge"}, 'placement.machineType "huge" is not in proxmox.machineTypes'),
        ({"image": "nope"}, 'placement.image "nope" is not in proxmox.templates'),
        ({"zone": "pve9"}, 'placement.zone "pve9" is not in proxmox.nodes'),
        ({"prefix": "Web_1"}, "a DNS label"),
        ({"count": "0"}, "greater than or equal to 1"),
        ({"count": "501"}, "less than or equal to 500"),
        ({"prefix": "a" * 55, "count": "10"}, "longer than 57 characters"),
        ({"cloud_init_text": "#cloud-config\n"}, "as a file or as pasted text, not both"),
    ],
)
def test_a_bad_form_says_what_to_fix_and_writes_nothing(
    sim: Sim, people: People, overrides: dict[str, Any], error: str
) -> None:
    page = people.client("operator").post(BULK, _form(sim, **overrides))
    assert page.status_code == 200
    assert error in page.content.decode().replace("&quot;", '"')
    assert b'id="bulk-confirm-form"' not in page.content
    assert not Proxy.objects.exists()


def test_names_already_taken_are_refused_at_preview_and_at_confirm(
    sim: Sim, people: People
) -> None:
    client = people.client("operator")
    preview = client.post(BULK, _form(sim, count="2"))
    hidden = _hidden(preview.content.decode())
    Proxy.objects.create(name="web-2", cluster=sim.cluster, machine_type="small", image="debian-13")
    again = client.post(BULK, _form(sim, count="2"))
    assert "proxies already exist: web-2" in again.content.decode()
    with posting():
        late = client.post(CONFIRM, hidden, follow=True)
    assert "Nothing was created: proxies already exist: web-2" in late.content.decode()
    assert list(Proxy.objects.values_list("name", flat=True)) == ["web-2"]
    assert not Operation.objects.exists()


def test_a_tampered_cloud_init_is_refused(sim: Sim, people: People) -> None:
    client = people.client("operator")
    hidden = _hidden(client.post(BULK, _form(sim)).content.decode())
    token = hidden["cloud_init_token"]
    hidden["cloud_init_token"] = token[:-8] + ("A" * 8 if not token.endswith("A" * 8) else "B" * 8)
    with posting():
        refused = client.post(CONFIRM, hidden, follow=True)
    assert "it was changed or made for something else" in refused.content.decode()
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_the_page_carries_no_at_rest_seal_and_no_cloud_init(sim: Sim, people: People) -> None:
    """The confirm token is not the database's seal: it opens with neither the at-rest keys nor
    without the signature, and the content is nowhere in the page, even base64-encoded."""
    import base64

    page = people.client("operator").post(BULK, _form(sim)).content.decode()
    token = _hidden(page)["cloud_init_token"]
    assert CLOUD_INIT_CANARY not in page
    assert base64.b64encode(CLOUD_INIT_CANARY.encode()).decode()[:16] not in page
    with pytest.raises(sealing.SealError):
        sealing.unseal(token.encode())


def test_a_confirm_past_its_max_age_is_refused(sim: Sim, people: People) -> None:
    """A token signed an hour ago (the page's own payload, re-signed with an old timestamp) is
    refused with the default max age of a few minutes; nothing is written."""
    import time

    from django.core import signing

    client = people.client("operator")
    hidden = _hidden(client.post(BULK, _form(sim)).content.decode())
    salt = sealed_tokens._salt(BULK_PURPOSE)
    payload = signing.loads(hidden["cloud_init_token"], salt=salt)

    class _AnHourAgo(signing.TimestampSigner):
        def timestamp(self) -> str:
            return signing.b62_encode(int(time.time()) - 3600)

    hidden["cloud_init_token"] = _AnHourAgo(salt=salt).sign_object(payload)
    with posting():
        refused = client.post(CONFIRM, hidden, follow=True)
    assert "it is older than 600 seconds" in refused.content.decode()
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_a_confirm_presented_by_another_user_is_refused(sim: Sim, people: People) -> None:
    hidden = _hidden(people.client("operator").post(BULK, _form(sim)).content.decode())
    with posting():
        refused = people.client("superuser").post(CONFIRM, hidden, follow=True)
    assert "it was made for another user" in refused.content.decode()
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_a_token_for_another_purpose_does_not_open_here(sim: Sim, people: People) -> None:
    client = people.client("operator")
    hidden = _hidden(client.post(BULK, _form(sim)).content.decode())
    hidden["cloud_init_token"] = sealed_tokens.token_dumps(
        b"#cloud-config\n", purpose="something-else", user_id=people.operator.pk
    )
    with posting():
        refused = client.post(CONFIRM, hidden, follow=True)
    assert "it was changed or made for something else" in refused.content.decode()
    assert not Proxy.objects.exists()
