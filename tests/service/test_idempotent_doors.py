"""Idempotency from every door (issue 10): a confirmation posted twice, or a command run again
with its key, returns the first operations instead of acting twice."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command
from pump import Pump, Sim
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationKind, OperationState

pytestmark = pytest.mark.django_db

REBOOT = "POST /nodes/{node}/qemu/{vmid}/status/reboot"
CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"


def _page_key(page_html: str) -> str:
    found = re.search(r'name="idempotency_key" value="([^"]+)"', page_html)
    assert found, "the confirmation page carries its key"
    return found.group(1)


@pytest.mark.parametrize(("action", "kind"), [("reboot", "reboot"), ("replace", "replace")])
def test_a_confirmation_posted_twice_acts_once(
    pump: Pump, sim: Sim, people: People, action: str, kind: str
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    page = client.post(PROXY_LIST, changelist_post(action, [alpha])).content.decode()
    key = _page_key(page)
    for _ in range(2):  # a double click: the same form, the same key
        with posting():
            client.post(
                PROXY_LIST, changelist_post(action, [alpha], post="yes", idempotency_key=key)
            )
    ops = Operation.objects.filter(proxy=alpha, kind=kind)
    assert ops.count() == 1 and ops.get().state != OperationState.FAILED
    pump.run()
    assert ops.get().state == OperationState.SUCCEEDED
    if kind == "reboot":
        assert sim.engine.ledger.count("POST", REBOOT) == 1
    else:
        assert sim.engine.ledger.count("POST", CLONE) == 2  # the create's and the replace's


def test_two_confirmation_pages_are_two_requests(pump: Pump, sim: Sim, people: People) -> None:
    """Keys belong to the page: asking twice on purpose (two pages) reboots twice."""
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    for _ in range(2):
        page = client.post(PROXY_LIST, changelist_post("reboot", [alpha])).content.decode()
        with posting():
            client.post(
                PROXY_LIST,
                changelist_post("reboot", [alpha], post="yes", idempotency_key=_page_key(page)),
            )
        pump.run()
    assert Operation.objects.filter(proxy=alpha, kind=OperationKind.REBOOT).count() == 2


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_a_command_run_again_with_its_key_returns_the_first_operations(
    pump: Pump, sim: Sim
) -> None:
    create = (
        "proxies",
        "create",
        "web-1",
        "web-2",
        "--cluster",
        "pvesim",
        "--machine-type",
        "small",
        "--image",
        "debian-13",
        "--zone",
        "pve1",
        "--idempotency-key",
        "deploy-42",
    )
    first = pump.call(_run, *create)
    again = pump.call(_run, *create)  # the first run's connection dropped; it is run again
    assert first == again
    assert Proxy.objects.count() == 2
    assert Operation.objects.filter(kind=OperationKind.CREATE).count() == 2
    pump.run()

    for _ in range(2):
        pump.call(_run, "proxies", "reboot", "web-1", "--idempotency-key", "reboot-7")
    assert Operation.objects.filter(kind=OperationKind.REBOOT).count() == 1
    for _ in range(2):
        pump.call(_run, "proxies", "delete", "web-2", "--idempotency-key", "rm-1")
    assert Operation.objects.filter(kind=OperationKind.DELETE).count() == 1
    pump.run()
    assert list(Proxy.objects.values_list("name", flat=True)) == ["web-1"]


def test_a_key_reused_for_another_request_is_refused(pump: Pump, sim: Sim) -> None:
    from provisioning.services import operations
    from provisioning.services.operations import IdempotencyConflict

    (alpha,) = running(pump, sim, "alpha")
    pump.call(operations.proxy_power, proxy=alpha, action="reboot", idempotency_key="k")
    with pytest.raises(IdempotencyConflict, match="already used for a different request"):
        operations.proxy_power(proxy=alpha, action="shutdown", idempotency_key="k")
