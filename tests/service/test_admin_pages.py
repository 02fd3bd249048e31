"""What the console's pages show: the proxy list and change page, the journal, the health
banner, and (over every page) never the token, the CA or a cloud-init."""

from __future__ import annotations

import re
from collections import deque
from datetime import timedelta
from urllib.parse import urljoin, urlsplit

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone
from pump import Pump, Sim
from test_admin_support import (
    CANARIES,
    CLOUD_INIT,
    CLOUD_INIT_CANARY,
    PROXY_LIST,
    People,
    changelist_post,
    people_fixture,  # noqa: F401
    posting,
    running,
    secret_files_fixture,  # noqa: F401
)

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationState, StepState
from provisioning.services import operations

pytestmark = pytest.mark.django_db

# The actions that answer with a page (provision queues at once and redirects).
PAGE_ACTIONS = (
    "replace",
    "start",
    "shutdown",
    "reboot",
    "delete_vms",
    "preview_plan",
    "preflight",
)


def _crawl(client: Client, start: str = "/admin/", limit: int = 400) -> dict[str, bytes]:
    """Every admin page reachable by GET from ``start`` (links and the first page of each
    list), without logging out; ``{path: body}``."""
    seen: dict[str, bytes] = {}
    queue = deque([start])
    while queue and len(seen) < limit:
        url = queue.popleft()
        if url in seen:
            continue
        response = client.get(url)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            seen[url] = b""
            continue
        seen[url] = response.content
        for href in re.findall(rb'href="([^"#]+)"', response.content):
            target = urljoin(url, href.decode().replace("&amp;", "&"))
            parts = urlsplit(target)
            if parts.netloc or not parts.path.startswith("/admin/"):
                continue
            if "logout" in parts.path or parts.path.endswith("/jsi18n/"):
                continue
            # One page of each list is enough: filters and sort orders repeat the same rows.
            if parts.query and not parts.query.startswith("proxy__id__exact"):
                continue
            queue.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    return seen


def test_no_page_shows_the_token_the_ca_or_a_cloud_init(
    pump: Pump, secret_files: Sim, people: People
) -> None:
    sim = secret_files
    alpha, beta = running(pump, sim, "alpha", "beta")
    client = people.client("superuser")
    pages = _crawl(client)
    visited = [url for url, body in pages.items() if body]
    assert len(visited) > 20
    for needed in (
        PROXY_LIST,
        f"{PROXY_LIST}{alpha.pk}/change/",
        f"{PROXY_LIST}{alpha.pk}/delete/",
        "/admin/provisioning/operation/",
        f"/admin/provisioning/cluster/{sim.cluster.pk}/change/",
        f"{PROXY_LIST}bulk-create/",
    ):
        assert needed in visited, needed
    op = Operation.objects.filter(proxy=alpha).first()
    assert op is not None and f"/admin/provisioning/operation/{op.pk}/change/" in visited

    # Pages that only a POST produces: every action's page, the bulk preview, form errors.
    posted = [client.post(PROXY_LIST, changelist_post(a, [alpha, beta])) for a in PAGE_ACTIONS]
    posted.append(
        client.post(
            f"{PROXY_LIST}bulk-create/",
            {
                "count": "2",
                "prefix": "web",
                "cluster": sim.cluster.pk,
                "machine_type": "small",
                "image": "debian-13",
                "zone": "pve1",
                "cloud_init_file": SimpleUploadedFile("user-data", CLOUD_INIT.encode()),
            },
        )
    )
    posted.append(  # a form error must not echo the pasted cloud-init back
        client.post(
            f"{PROXY_LIST}add/",
            {
                "name": "Not A Label",
                "cluster": sim.cluster.pk,
                "machine_type": "small",
                "image": "debian-13",
                "cloud_init_text": CLOUD_INIT,
            },
        )
    )
    posted.append(
        client.post(
            f"{PROXY_LIST}{alpha.pk}/change/",
            {
                "zone": "nowhere",
                "machine_type": "small",
                "image": "debian-13",
                "cloud_init_text": CLOUD_INIT,
            },
        )
    )
    posted.append(
        client.post(
            "/admin/provisioning/cluster/",
            {"action": "preflight", "_selected_action": [str(sim.cluster.pk)]},
        )
    )
    assert [r.status_code for r in posted] == [200] * len(posted)
    assert b"errornote" in posted[-3].content and b"errornote" in posted[-2].content
    for url, body in [*pages.items(), *((f"POST {i}", r.content) for i, r in enumerate(posted))]:
        for canary in CANARIES:
            assert canary.encode() not in body, f"{canary} on {url}"
    # The paths are shown, never the files' content.
    cluster_page = pages[f"/admin/provisioning/cluster/{sim.cluster.pk}/change/"]
    assert sim.cluster.token_file.encode() in cluster_page


def test_the_change_page_shows_spec_state_console_and_operations(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    pump.call(operations.proxy_retry, proxy=alpha)  # a second create, which adopts the VM
    pump.run()
    alpha.refresh_from_db()
    page = people.client("superuser").get(f"{PROXY_LIST}{alpha.pk}/change/")
    text = page.content.decode()
    size = len(CLOUD_INIT.encode())
    assert f"{size} bytes, HMAC-SHA256 {alpha.cloud_init_sha256}" in text
    assert CLOUD_INIT_CANARY not in text
    assert alpha.provider_id in text and str(alpha.uid) in text and alpha.ip in text
    console = f"https://127.0.0.1:8006/?console=kvm&amp;novnc=1&amp;vmid={alpha.vmid}&amp;node=pve1"
    assert console in text
    ops = list(Operation.objects.filter(proxy=alpha).order_by("-created_at"))
    positions = [text.index(f"/admin/provisioning/operation/{op.pk}/change/") for op in ops]
    assert len(ops) == 2
    assert positions == sorted(positions), "newest first"
    assert 'name="cloud_init_file"' in text and 'name="cloud_init_text"' in text


def test_the_list_shows_badges_short_errors_and_searches_every_key(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha, beta = running(pump, sim, "alpha", "beta")
    long_error = "the template disk could not be read " + "x" * 200 + " END-OF-ERROR"
    Proxy.objects.filter(pk=beta.pk).update(phase="Failed", last_error=long_error)
    client = people.client("operator")
    text = client.get(PROXY_LIST).content.decode()
    assert 'class="ph-badge ph-ok">Running<' in text
    assert 'class="ph-badge ph-bad">Failed<' in text
    assert f'title="{long_error}"' in text  # in full on hover
    assert text.count("END-OF-ERROR") == 1  # and only there
    assert "search_help_text" not in text and "exactly a UID, a VMID, or an address" in text

    def found(term: str) -> set[str]:
        body = client.get(PROXY_LIST, {"q": term}).content.decode()
        return {n for n in ("alpha", "beta") if f">{n}</a>" in body}

    assert found("alp") == {"alpha"}
    assert found(str(beta.uid)) == {"beta"}
    assert found(str(alpha.vmid)) == {"alpha"}
    assert found(alpha.ip) == {"alpha"}
    assert found(".".join(alpha.ip.split(".")[:2]) + ".") == {"alpha", "beta"}
    assert found("no-such-proxy") == set()


def test_the_list_warns_when_a_cluster_has_no_ready_node(sim: Sim, people: People) -> None:
    from healthchecks.models import NodeHealth

    client = people.client("viewer")
    assert b"health-banner" not in client.get(PROXY_LIST).content
    now = timezone.now()
    for node in ("pve1", "pve2", "pve3"):
        NodeHealth.objects.create(
            cluster=sim.cluster,
            node=node,
            ready=False,
            reason="Unreachable",
            message=f"{node} did not answer",
            duration=0.1,
            checked_at=now,
            latest=True,
        )
    text = client.get(PROXY_LIST).content.decode()
    assert 'id="health-banner"' in text and ">pvesim</a>" in text
    cluster_page = client.get(f"/admin/provisioning/cluster/{sim.cluster.pk}/change/")
    body = cluster_page.content.decode()
    assert "pve2 did not answer" in body and "Unreachable" in body and "not ready" in body
    listing = client.get("/admin/provisioning/cluster/").content.decode()
    assert "0 of 3 nodes ready" in listing


def test_the_operation_page_lists_steps_phases_and_reloads_while_running(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    op = Operation.objects.get(proxy=alpha)
    client = people.client("viewer")
    text = client.get(f"/admin/provisioning/operation/{op.pk}/change/").content.decode()
    for step in op.steps.all():
        assert f'class="step step-{step.name}"' in text
        if step.upid:
            assert step.upid in text
    assert op.steps.filter(name="clone").exclude(upid="").exists()
    for phase in ("queue", "clone", "upload", "configure", "resize", "start", "boot-to-address"):
        assert f'<th scope="col">{phase}</th>' in text
    assert 'aria-valuenow="100"' in text
    assert 'id="operation-refresh"' not in text, "an ended operation does not reload"

    # A running operation: the bar sits part-way and the page reloads itself.
    started = timezone.now() - timedelta(seconds=5)
    running_op = Operation.objects.create(
        kind="create",
        proxy=alpha,
        proxy_name="alpha",
        cluster=sim.cluster,
        state=OperationState.WAITING,
        started_at=started,
    )
    OperationStep.objects.create(
        operation=running_op,
        seq=1,
        name="lookup",
        state=StepState.SUCCEEDED,
        started_at=started,
        finished_at=started + timedelta(seconds=1),
    )
    OperationStep.objects.create(
        operation=running_op,
        seq=2,
        name="clone",
        state=StepState.WAITING,
        upid="UPID:pve1:00000001:00000002:00000003:qmclone:9000:root@pam:",
        started_at=started + timedelta(seconds=1),
    )
    text = client.get(f"/admin/provisioning/operation/{running_op.pk}/change/").content.decode()
    assert re.search(r'<meta http-equiv="refresh" content="\d+" id="operation-refresh">', text)
    progress = int(re.search(r'aria-valuenow="(\d+)"', text).group(1))  # type: ignore[union-attr]
    assert 0 < progress < 50
    assert "UPID:pve1:00000001" in text and "so far" in text


def test_the_journal_is_read_only(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    op = Operation.objects.get(proxy=alpha)
    client = people.client("superuser")
    listing = client.get("/admin/provisioning/operation/").content.decode()
    assert 'name="_selected_action"' not in listing
    assert "/admin/provisioning/operation/add/" not in listing
    page = client.get(f"/admin/provisioning/operation/{op.pk}/change/").content.decode()
    assert 'name="_save"' not in page and "deletelink" not in page
    with posting():
        refused = client.post(f"/admin/provisioning/operation/{op.pk}/change/", {"state": "failed"})
    assert refused.status_code == 403
    assert client.get(f"/admin/provisioning/operation/{op.pk}/delete/").status_code == 403
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
